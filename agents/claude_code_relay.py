"""A byte relay between a TCP port and a Unix socket (stdlib only).

Claude Code runs inside `unshare -n`: a network namespace with only its own loopback,
so nothing it tries can leave the machine. The gateway runs outside it. A Unix socket
is a file, which both namespaces see: outside, the socket is relayed to the gateway's
TCP port (`unix_to_tcp`, or a `Relay` thread); inside, claude_code_episode.py relays
127.0.0.1:<port> to the socket.
"""

from __future__ import annotations

import asyncio
import threading
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
        await asyncio.gather(_pipe(reader, t_writer), _pipe(t_reader, writer))

    return handle


async def unix_to_tcp(unix_path: str, tcp_port: int, host: str = "127.0.0.1") -> asyncio.Server:
    """Serve `unix_path` on the running loop, relaying each connection to host:tcp_port."""
    handle = _handler(lambda: asyncio.open_connection(host, tcp_port))
    return await asyncio.start_unix_server(handle, unix_path)


class Relay:
    """Serve in a daemon thread until `stop()`: TCP -> Unix socket, or the reverse."""

    def __init__(self, *, tcp_port: int, unix_path: str, listen_on: str) -> None:
        self.tcp_port, self.unix_path, self.listen_on = tcp_port, unix_path, listen_on
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("relay did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self) -> None:
        if self.listen_on == "unix":
            self._server = await unix_to_tcp(self.unix_path, self.tcp_port)
        else:
            handle = _handler(lambda: asyncio.open_unix_connection(self.unix_path))
            self._server = await asyncio.start_server(handle, "127.0.0.1", self.tcp_port)

    def stop(self) -> None:
        def close() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(close)
        self._thread.join(5)
