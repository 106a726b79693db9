"""HTTP to external engines: one aiohttp session, errors in three kinds.

Every completion the gateway serves from an external engine is one request here, so
its CPU cost is paid per turn. aiohttp's client spends about a quarter of httpx's CPU
per request on this machine (0.25-0.34 ms against 1.1-2.0 ms for a 600-token
/generate with logprobs, docs/benchmarks.md), which is why engines do not use httpx.
Callers see `Reply` objects and `ConnectFailed` / `TimedOut` / `HTTPFailed`, not the
library's own types.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp


class HTTPFailed(Exception):
    """The request did not complete (connection reset, bad response, ...)."""


class ConnectFailed(HTTPFailed):
    """No connection could be made: the server is not there."""


class TimedOut(HTTPFailed):
    """The server did not answer in time."""


@dataclass(slots=True)
class Reply:
    status: int
    content: bytes


class StreamReply:
    """An open response whose body is read line by line."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status

    async def read(self) -> bytes:
        return await self._response.read()

    async def lines(self) -> AsyncIterator[str]:
        async for raw in self._response.content:
            yield raw.decode("utf-8", errors="replace").rstrip("\r\n")

    async def events(self) -> AsyncIterator[str]:
        """The `data:` payloads of a server-sent event stream, up to `[DONE]`."""
        async for line in self.lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            yield payload


class EngineHTTP:
    """A connection pool to one or more engine servers (started inside the event loop)."""

    def __init__(
        self,
        *,
        headers: dict[str, str],
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
    ) -> None:
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                # bodies are already JSON bytes; responses are parsed by the caller
                skip_auto_headers=("User-Agent",),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _timeout_of(self, seconds: float | None) -> aiohttp.ClientTimeout:
        if seconds is None:
            return self._timeout
        return aiohttp.ClientTimeout(total=seconds, sock_connect=self._connect_timeout_s)

    async def get(self, url: str, *, timeout: float | None = None) -> Reply:
        return await self._call("GET", url, None, None, timeout)

    async def post(
        self,
        url: str,
        body: bytes,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Reply:
        return await self._call("POST", url, body, headers, timeout)

    async def _call(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> Reply:
        assert self._session is not None, "EngineHTTP.start() was not awaited"
        with _errors(url):
            async with self._session.request(
                method, url, data=body, headers=headers, timeout=self._timeout_of(timeout)
            ) as r:
                return Reply(r.status, await r.read())
        raise AssertionError("unreachable")  # pragma: no cover - _errors re-raises

    @asynccontextmanager
    async def stream(
        self, url: str, body: bytes, *, headers: dict[str, str] | None = None
    ) -> AsyncIterator[StreamReply]:
        assert self._session is not None, "EngineHTTP.start() was not awaited"
        with _errors(url):
            async with self._session.post(url, data=body, headers=headers) as r:
                yield StreamReply(r)


class _errors:
    """aiohttp's exceptions as ours (a context manager, so that `with` re-raises)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb) -> bool:
        if exc is None:
            return False
        if isinstance(exc, aiohttp.ClientConnectorError):
            raise ConnectFailed(f"{self.url}: {exc}") from exc
        if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            raise TimedOut(f"{self.url}: no answer in time") from exc
        if isinstance(exc, aiohttp.ClientError):
            raise HTTPFailed(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        return False
