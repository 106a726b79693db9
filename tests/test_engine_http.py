"""The remote engines' HTTP (gateway/inference/remote.py, on one aiohttp session) against
raw servers on loopback: what a request carries, what a server can send (streams split
anywhere, a 1 MB event, bodies cut short, garbage, stalls) and that the next request
still works after each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from gateway.inference.base import EngineError, SamplingParams
from gateway.inference.remote import ServerOptions, ServerUnreachable, sse_events
from gateway.inference.sglang import SGLangEngine

Reply = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[bool]]
PROMPT = [11, 12, 13]
ANSWER = json.dumps(
    {
        "meta_info": {
            "finish_reason": {"type": "stop"},
            "completion_tokens": 2,
            "output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]],
        }
    }
).encode()


class RawServer:
    """A loopback TCP server that reads HTTP/1.1 requests and runs `reply` for each."""

    def __init__(self, reply: Reply) -> None:
        """`reply(head, body, writer)` answers one request; False: close the connection."""
        self.reply = reply
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
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
            writer.close()


def ok(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def answer(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
    """/generate: ANSWER (as one event of a stream if asked); else (the engine's info
    calls at start): 404."""
    if not head.startswith(b"POST /generate"):
        w.write(ok(b"", b"404 Not Found"))
    elif json.loads(body)["stream"]:
        w.write(ok(b"data: %s\n\ndata: [DONE]\n\n" % ANSWER))
    else:
        w.write(ok(ANSWER))
    await w.drain()
    return True


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_requests_share_one_kept_alive_connection_and_carry_their_headers_and_body() -> None:
    async def main() -> None:
        server = RawServer(answer)
        async with server as url:
            engine = SGLangEngine(url, ServerOptions(max_context=4096, api_key="k"))
            await engine.start()
            for _ in range(5):
                result = await engine.generate(PROMPT, SamplingParams(4), route_key="s1")
                assert (result.output_ids, result.logprobs) == ([7, 8], [-0.5, -0.25])
            await engine.close()
        assert server.connections == 1
        head, body = server.requests[-1]
        assert head.startswith(b"POST /generate HTTP/1.1\r\n")
        for line in (b"Authorization: Bearer k", b"X-SMG-Routing-Key: s1",
                     b"Content-Type: application/json"):  # fmt: skip
            assert line in head
        assert b"User-Agent" not in head and b"Accept-Encoding" not in head
        # the prompt's JSON, kept in parts (gateway/token_ids.py), arrives as one object
        assert json.loads(body)["input_ids"] == PROMPT

    run(main())


def test_streams_read_by_event_across_any_split_and_a_long_event_is_whole() -> None:
    """SSE lines are split by us, not aiohttp's line reader: a cumulative SGLang event
    with logprobs can pass 1 MB, over what that reader takes."""
    events = [b'{"n": %d, "text": "a\\u2603b"}' % i for i in range(6)]
    events.append(b'{"x": "' + b"y" * 1_000_000 + b'"}')
    wire = b"".join(b"data: " + e + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n"

    async def reply(head: bytes, _body: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        small = wire[: -len(events[-1]) - 30]
        # the small events in chunks that split lines and events, the long one whole
        parts = [small[i : i + 7] for i in range(0, len(small), 7)] if b"/odd" in head else []
        w.write(b"".join(map(chunk, parts)) + chunk(wire[sum(map(len, parts)) :]))
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    async def main() -> None:
        async with RawServer(reply) as url, aiohttp.ClientSession() as http:
            for path in ("/odd", "/whole"):
                async with http.post(f"{url}{path}", data=b"{}") as r:
                    assert [p async for p in sse_events(r.content)] == events

    run(main())


def test_a_reply_cut_short_garbage_or_a_stall_is_an_engine_error_and_the_next_works() -> None:
    failures = {"short": "failed", "garbage": "failed", "nothing": "failed",
                "stream-cut": "failed", "stall": "did not answer within 0.5 s"}  # fmt: skip
    modes: list[str] = []

    async def reply(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
        mode = modes.pop() if modes and head.startswith(b"POST /generate") else "fine"
        if mode == "fine":
            return await answer(head, body, w)
        if mode == "short":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        elif mode == "garbage":
            w.write(b"this is not HTTP\r\n\r\n")
        elif mode in ("stream-cut", "stall"):
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            w.write(chunk(b'data: {"meta_info": {"finish_reason": null}}\n\n'))
            await w.drain()
            if mode == "stall":
                await asyncio.sleep(5)
        await w.drain()
        return False

    async def ask(engine: SGLangEngine, stream: bool) -> list[int]:
        if not stream:
            return (await engine.generate(PROMPT, SamplingParams(4))).output_ids
        items = [item async for item in engine.stream(PROMPT, SamplingParams(4))]
        return items[-1].output_ids  # type: ignore[union-attr]

    async def main() -> None:
        async with RawServer(reply) as url:
            engine = SGLangEngine(url, ServerOptions(timeout_s=0.5, max_context=4096))
            await engine.start()
            for mode, match in failures.items():
                # a connection closed before any answer is sent again once: it fails twice
                modes.extend([mode] * (2 if mode == "nothing" else 1))
                stream = mode in ("stream-cut", "stall")
                with pytest.raises(EngineError, match=match) as err:
                    await ask(engine, stream)
                assert not isinstance(err.value, ServerUnreachable)
                assert url in str(err.value)
                assert await ask(engine, stream) == [7, 8], f"after {mode}"
            await engine.close()

    run(main())


def test_a_generation_whose_connection_breaks_before_any_answer_is_sent_again() -> None:
    """A kept-alive connection the server closes just as it is reused takes the request
    with it: nothing was generated, so the engine sends it again (once), streamed or not,
    and the agent sees one answer, not a 503."""
    drops: list[bytes] = []

    async def drop_every_other(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
        if head.startswith(b"POST /generate") and len(drops) % 2 == 0:
            drops.append(head)
            return False  # closed without an answer
        if head.startswith(b"POST /generate"):
            drops.append(head)
        return await answer(head, body, w)

    async def main() -> None:
        server = RawServer(drop_every_other)
        async with server as url:
            engine = SGLangEngine(url, ServerOptions(max_context=4096))
            await engine.start()
            result = await engine.generate(PROMPT, SamplingParams(4))
            assert result.output_ids == [7, 8] and result.logprobs == [-0.5, -0.25]
            items = [item async for item in engine.stream(PROMPT, SamplingParams(4))]
            assert items[-1].output_ids == [7, 8]  # type: ignore[union-attr]
            assert len(drops) == 4  # each request: dropped once, answered the second time
            sent = [json.loads(b) for h, b in server.requests if h.startswith(b"POST /gen")]
            assert all(body["input_ids"] == PROMPT for body in sent)  # the same request again
            await engine.close()

    run(main())


def test_a_control_call_whose_connection_breaks_is_sent_again() -> None:
    """A weight update's pause once failed on a kept-alive connection vLLM closed (idle 5 s)
    as it was reused: control calls (pause, load, resume) are sent again once."""
    broken = []

    async def drop_first_control(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
        if head.startswith(b"POST /pause") and not broken:
            broken.append(head)
            return False  # closed without an answer
        if head.startswith(b"POST /pause"):
            w.write(ok(b'{"paused": true}'))
            await w.drain()
            return True
        return await answer(head, body, w)

    async def main() -> None:
        server = RawServer(drop_first_control)
        async with server as url:
            engine = SGLangEngine(url, ServerOptions(max_context=4096))
            await engine.start()
            assert await engine.control(url, "/pause") == {"paused": True}
            assert len(broken) == 1 and len(server.requests) >= 2
            result = await engine.generate(PROMPT, SamplingParams(4))
            assert result.output_ids == [7, 8]  # and the engine goes on serving
            await engine.close()

    run(main())
