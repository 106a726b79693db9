"""The engine HTTP client (gateway/inference/http_client.py) against raw servers on
loopback: what an engine can send (lengths, chunks, bodies that end with the connection,
streams split anywhere, closes, stalls, garbage) and what the pool must keep to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gateway.inference import http_client
from gateway.inference.http_client import ConnectFailed, EngineHTTP, HTTPFailed, TimedOut

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A loopback TCP server that reads HTTP/1.1 requests and runs `reply` for each."""

    def __init__(self, reply: Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[bool]]):
        """`reply(head, body, writer)` answers one request; False: close the connection."""
        self.reply = reply
        self.connections = 0
        self.live = 0
        self.most_live = 0
        self.requests: list[tuple[bytes, bytes]] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.live += 1
        self.most_live = max(self.most_live, self.live)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                if not await self.reply(head, body, writer):
                    return
        finally:
            self.live -= 1
            writer.close()


def ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body)
    return head + b"".join(e + b"\r\n" for e in extra) + b"\r\n" + body


async def echo(head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(ok(body or head.split(b" ")[1]))
    await writer.drain()
    return True


def client(**kw: float) -> EngineHTTP:
    args = {"timeout_s": 5.0, "connect_timeout_s": 2.0, "max_connections": 4} | kw
    return EngineHTTP(headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
                      **args)  # type: ignore[arg-type]  # fmt: skip


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_requests_share_one_kept_alive_connection_and_carry_their_headers() -> None:
    async def main() -> None:
        server = RawServer(echo)
        async with server as url:
            c = client()
            await c.start()
            for i in range(20):
                r = await c.post(f"{url}/generate?x=1", b'{"i": %d}' % i, headers={"X-Route": "s1"})
                assert (r.status, r.content) == (200, b'{"i": %d}' % i)
            r = await c.get(f"{url}/health")
            assert r.content == b"/health"
            await c.close()
        assert server.connections == 1
        head, body = server.requests[0]
        assert head.startswith(b"POST /generate?x=1 HTTP/1.1\r\n")
        for line in (b"Host: 127.0.0.1:", b"Authorization: Bearer k", b"X-Route: s1",
                     b"Content-Type: application/json", b"Content-Length: 8"):  # fmt: skip
            assert line in head
        assert server.requests[-1][0].startswith(b"GET /health HTTP/1.1\r\n")
        assert b"Content-Length" not in server.requests[-1][0]

    run(main())


def test_chunked_bodies_and_bodies_that_end_with_the_connection() -> None:
    async def reply(head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        if b"chunked" in head:
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")  # fmt: skip
            await w.drain()
            return True
        w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await w.drain()
        return False

    async def main() -> None:
        server = RawServer(reply)
        async with server as url:
            c = client()
            await c.start()
            assert (await c.get(f"{url}/chunked")).content == b"hello world"
            assert (await c.get(f"{url}/chunked")).content == b"hello world"
            assert server.connections == 1  # a chunked body keeps the connection
            assert (await c.get(f"{url}/eof")).content == b"until the end"
            assert (await c.get(f"{url}/chunked")).content == b"hello world"
            assert server.connections == 2  # one that ends with the connection does not
            await c.close()

    run(main())


def test_a_body_cut_short_or_a_malformed_reply_is_an_error_and_the_next_request_works() -> None:
    async def reply(head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        if b"/short" in head:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        elif b"/garbage" in head:
            w.write(b"this is not HTTP\r\n\r\n")
        elif b"/nothing" in head:
            pass
        else:
            w.write(ok(b"fine"))
            await w.drain()
            return True
        await w.drain()
        return False

    async def main() -> None:
        async with RawServer(reply) as url:
            c = client()
            await c.start()
            for path in ("/short", "/garbage", "/nothing"):
                with pytest.raises(HTTPFailed) as err:
                    await c.post(f"{url}{path}", b"{}")
                assert not isinstance(err.value, (ConnectFailed, TimedOut))
                assert url in str(err.value)
                assert (await c.post(f"{url}/ok", b"{}")).content == b"fine"
            await c.close()

    run(main())


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def reply(_head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(ok(b"once"))
        await w.drain()
        return False  # a keep-alive timeout, right after the reply

    async def main() -> None:
        server = RawServer(reply)
        async with server as url:
            c = client()
            await c.start()
            for _ in range(5):
                assert (await c.post(f"{url}/x", b"{}")).content == b"once"
                await asyncio.sleep(0.05)
            assert server.connections == 5
            await c.close()

    run(main())


def test_no_answer_in_time_is_timed_out_and_leaves_the_pool_usable() -> None:
    async def reply(head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        if b"/slow" in head:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")  # then stalls
            await w.drain()
            await asyncio.sleep(5)
            return False
        w.write(ok(b"quick"))
        await w.drain()
        return True

    async def main() -> None:
        async with RawServer(reply) as url:
            c = client(timeout_s=0.3, max_connections=1)
            await c.start()
            with pytest.raises(TimedOut):
                await c.post(f"{url}/slow", b"{}")
            with pytest.raises(TimedOut):
                await c.get(f"{url}/slow", timeout=0.1)
            # the one slot was given back, and the stalled connection was not reused
            assert (await c.post(f"{url}/fast", b"{}")).content == b"quick"
            assert (await c.get(f"{url}/fast", timeout=0.1)).content == b"quick"
            await c.close()

    run(main())


def test_nothing_listening_is_connect_failed() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        c = client()
        await c.start()
        with pytest.raises(ConnectFailed):
            await c.post(f"http://127.0.0.1:{port}/generate", b"{}")
        await c.close()

    run(main())


def test_concurrent_requests_are_bounded_by_max_connections() -> None:
    async def reply(_head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.01)
        w.write(ok(body))
        await w.drain()
        return True

    async def main() -> None:
        server = RawServer(reply)
        async with server as url:
            c = client(max_connections=3)
            await c.start()
            replies = await asyncio.gather(*(c.post(f"{url}/g", b"%d" % i) for i in range(30)))
            assert [r.content for r in replies] == [b"%d" % i for i in range(30)]
            await c.close()
        assert server.most_live <= 3
        assert server.connections == 3

    run(main())


def test_streams_read_by_event_across_any_split_and_an_abandoned_stream_is_closed() -> None:
    events = [b'{"n": %d, "text": "a\\u2603b"}' % i for i in range(6)]
    wire = b"".join(b"data: " + e + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n"

    async def reply(head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        step = 7 if b"/odd" in head else len(wire)
        for i in range(0, len(wire), step):  # chunks that split lines and events
            part = wire[i : i + step]
            w.write(b"%x\r\n%s\r\n" % (len(part), part))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    async def main() -> None:
        server = RawServer(reply)
        async with server as url:
            c = client()
            await c.start()
            for path in ("/odd", "/whole"):
                async with c.stream(f"{url}{path}", b"{}") as r:
                    assert r.status == 200
                    got = [p.encode() async for p in r.events()]
                assert got == events
            assert server.connections == 1
            async with c.stream(f"{url}/odd", b"{}") as r:
                async for _ in r.events():
                    break  # the reader stops early: the rest is not read
            async with c.stream(f"{url}/odd", b"{}") as r:
                assert len([p async for p in r.events()]) == 6
            assert server.connections == 2
            await c.close()

    run(main())


def test_a_cancelled_request_frees_its_slot_and_its_connection() -> None:
    async def reply(head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        if b"/hang" in head:
            await asyncio.sleep(5)
        w.write(ok(b"here"))
        await w.drain()
        return True

    async def main() -> None:
        async with RawServer(reply) as url:
            c = client(max_connections=1)
            await c.start()
            task = asyncio.create_task(c.post(f"{url}/hang", b"{}"))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            r = await asyncio.wait_for(c.post(f"{url}/ok", b"{}"), 2)
            assert r.content == b"here"
            await c.close()

    run(main())


def test_a_fast_stream_read_slowly_is_not_buffered_without_bound(monkeypatch) -> None:
    monkeypatch.setattr(http_client, "_HIGH_WATER", 64 * 1024)
    block = b"data: " + b"x" * 4090 + b"\n\n"

    async def reply(_head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(block) * 500))
        for _ in range(500):  # 2 MB
            w.write(block)
            await w.drain()
        return True

    async def main() -> None:
        async with RawServer(reply) as url:
            c = client()
            await c.start()
            most = 0
            async with c.stream(f"{url}/big", b"{}") as r:
                n = 0
                async for _ in r.events():
                    n += 1
                    if n % 50 == 0:
                        await asyncio.sleep(0.01)  # a slow reader
                        most = max(most, r._buffered)
            assert n == 500
            assert most < 64 * 1024 + 512 * 1024  # the socket's buffers, not the stream
            await c.close()

    run(main())


def test_header_values_cannot_smuggle_lines_and_urls_must_be_http() -> None:
    async def main() -> None:
        c = client()
        await c.start()
        with pytest.raises(ValueError):
            await c.post("http://127.0.0.1:1/x", b"{}", headers={"X-Route": "a\r\nEvil: 1"})
        with pytest.raises(ValueError):
            await c.post("ftp://127.0.0.1/x", b"{}")
        await c.close()

    run(main())


def test_a_body_in_parts_arrives_whole() -> None:
    """A long prompt's JSON is sent as its kept parts (gateway/token_ids.py), not joined."""

    async def main() -> None:
        server = RawServer(echo)
        async with server as url:
            c = client()
            await c.start()
            parts = (
                b'{"input_ids":',
                b"[1,2,3",
                b",4,5",
                b"],",
                memoryview(b'{"stream":false}')[1:],
            )
            r = await c.post(f"{url}/generate", parts)
            assert r.content == b'{"input_ids":[1,2,3,4,5],"stream":false}'
            await c.close()
        assert b"Content-Length: 40\r\n" in server.requests[0][0]

    run(main())


def test_a_stream_that_stalls_times_out_one_cut_short_fails_and_a_long_event_is_whole() -> None:
    """The deadline covers reading a stream; a 1 MB event (a cumulative SGLang event
    with logprobs can be that long) arrives whole."""
    long_event = b'{"x": "' + b"y" * 1_000_000 + b'"}'

    async def reply(head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        first = b"data: " + (long_event if b"/long" in head else b"{}") + b"\n\n"
        w.write(b"%x\r\n%s\r\n" % (len(first), first))
        await w.drain()
        if b"/stall" in head:
            await asyncio.sleep(5)
        elif b"/long" in head:
            w.write(b"0\r\n\r\n")
            await w.drain()
            return True
        return False  # /cut: the connection ends inside the chunked body

    async def main() -> None:
        async with RawServer(reply) as url:
            c = client(timeout_s=0.5)
            await c.start()
            with pytest.raises(TimedOut):
                async with c.stream(f"{url}/stall", b"{}") as r:
                    async for _ in r.events():
                        pass
            with pytest.raises(HTTPFailed) as err:
                async with c.stream(f"{url}/cut", b"{}") as r:
                    assert [p async for p in r.events()] == ["{}"]
            assert not isinstance(err.value, (ConnectFailed, TimedOut))
            async with c.stream(f"{url}/long", b"{}") as r:
                assert [p.encode() async for p in r.events()] == [long_event]
            await c.close()

    run(main())
