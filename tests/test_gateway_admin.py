"""The trainer's admin client against a real loopback HTTP server that drops the first
connection without an answer, as a gateway closing a keep-alive connection the client
was just reusing does: an idempotent GET is retried once, a POST never."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from trainer.rollout.gateways import GatewayAdmin


class DroppingServer:
    """Answers every request with `{"ok": true}`, but closes the first `drops`
    connections after reading their request, without a byte of answer."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.requests: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            lines = head.decode().split("\r\n")
            length = next(
                (int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")), 0
            )
            await reader.readexactly(length)
            self.requests.append(lines[0])
            if self.drops > 0:
                self.drops -= 1
                break
            body = json.dumps({"ok": True}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[DroppingServer, str]]:
    state = DroppingServer(drops=1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await state.handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield state, f"http://127.0.0.1:{port}/v1"
    finally:
        srv.close()
        await srv.wait_closed()


async def test_a_get_on_a_dropped_connection_is_retried_once(server) -> None:
    state, url = server
    async with httpx.AsyncClient(timeout=10) as http:
        view = await GatewayAdmin(url, "k", http).session("s1")
    assert view == {"ok": True}
    assert state.requests == ["GET /v1/sessions/s1 HTTP/1.1"] * 2


async def test_a_get_dropped_twice_fails(server) -> None:
    state, url = server
    state.drops = 2
    async with httpx.AsyncClient(timeout=10) as http:
        with pytest.raises(httpx.TransportError):
            await GatewayAdmin(url, "k", http).session("s1")
    assert len(state.requests) == 2


async def test_a_post_on_a_dropped_connection_is_not_sent_again(server) -> None:
    state, url = server
    async with httpx.AsyncClient(timeout=10) as http:
        admin = GatewayAdmin(url, "k", http)
        with pytest.raises(httpx.TransportError):
            await admin.set_rewards({"c1": 1.0})
        assert state.requests == ["POST /v1/rewards HTTP/1.1"]
        await admin.set_rewards({"c1": 1.0})  # a later call goes on a fresh connection
    assert state.requests == ["POST /v1/rewards HTTP/1.1"] * 2
