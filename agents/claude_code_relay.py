"""A byte relay between a TCP port and a Unix socket (stdlib only).

Claude Code runs inside `unshare -n`: a network namespace with only its own loopback,
so nothing it tries can leave the machine. The gateway runs outside it. A Unix socket
is a file, which both namespaces see: outside, the socket is relayed to the gateway's
TCP port (`unix_to_tcp`); inside, claude_code_episode.py relays 127.0.0.1:<port> to
the socket (`tcp_to_unix`). Both serve on the event loop that is running already.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def _handler(open_target: Opener) -> Callable[..., Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            t_reader, t_writer = await open_target()
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, t_writer), _pipe(t_reader, writer))
        except asyncio.CancelledError:  # the loop is ending: no traceback (Python 3.11 logs one)
            pass

    return handle


async def unix_to_tcp(unix_path: str, tcp_port: int, host: str = "127.0.0.1") -> asyncio.Server:
    """Serve `unix_path` on the running loop, relaying each connection to host:tcp_port."""
    handle = _handler(lambda: asyncio.open_connection(host, tcp_port))
    return await asyncio.start_unix_server(handle, unix_path)


async def tcp_to_unix(tcp_port: int, unix_path: str) -> asyncio.Server:
    """Serve 127.0.0.1:tcp_port on the running loop, relaying each connection to `unix_path`."""
    handle = _handler(lambda: asyncio.open_unix_connection(unix_path))
    return await asyncio.start_server(handle, "127.0.0.1", tcp_port)
