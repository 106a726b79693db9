"""HTTP to external engines, on aiohttp.

aiohttp does the HTTP: kept-alive connections pooled up to `max_connections`, a connect
timeout and a deadline per request (that of a stream covers reading it), chunked,
length-framed and until-close bodies, flow control on streams, TLS. What is ours is
the little the engines read: a `Reply`, a `StreamReply` read by server-sent event, and
three errors (`ConnectFailed`, `TimedOut`, `HTTPFailed`) so that no aiohttp type
leaves this module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import aiohttp

# A request body: bytes, or its parts in order (a long prompt's JSON is kept in parts,
# gateway/token_ids.py), joined here: aiohttp sends a body whole or streamed in chunks.
Body = bytes | tuple[bytes | memoryview, ...]


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
    """An open response whose body is read whole, line by line, or by event."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status

    async def read(self) -> bytes:
        return await self._response.read()

    async def lines(self) -> AsyncIterator[str]:
        # (split here, not by aiohttp's readline: that refuses a line over its buffer,
        # and a cumulative SGLang event with logprobs can be longer)
        rest = b""
        async for chunk in self._response.content.iter_any():
            rest += chunk
            *whole, rest = rest.split(b"\n")
            for line in whole:
                yield line.decode("utf-8", errors="replace").rstrip("\r")
        if rest:
            yield rest.decode("utf-8", errors="replace").rstrip("\r")

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
        self._connect_timeout_s = connect_timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                headers=self._headers,
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, url: str, *, timeout: float | None = None) -> Reply:
        with _errors(url):
            async with self._started().get(url, **self._deadline(timeout)) as r:
                return Reply(r.status, await r.read())

    async def post(
        self,
        url: str,
        body: Body,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Reply:
        with _errors(url):
            async with self._started().post(
                url, data=_joined(body), headers=headers, **self._deadline(timeout)
            ) as r:
                return Reply(r.status, await r.read())

    @asynccontextmanager
    async def stream(
        self, url: str, body: Body, *, headers: dict[str, str] | None = None
    ) -> AsyncIterator[StreamReply]:
        """A POST whose reply is read as it comes (errors while reading map too)."""
        with _errors(url):
            async with self._started().post(url, data=_joined(body), headers=headers) as r:
                yield StreamReply(r)

    def _started(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("EngineHTTP.start() was not awaited")
        return self._session

    def _deadline(self, timeout: float | None) -> dict[str, aiohttp.ClientTimeout]:
        if timeout is None:
            return {}
        return {"timeout": aiohttp.ClientTimeout(total=timeout, connect=self._connect_timeout_s)}


def _joined(body: Body) -> bytes:
    return body if isinstance(body, bytes) else b"".join(body)


@contextmanager
def _errors(url: str) -> Iterator[None]:
    """aiohttp's failures as ours, each naming the URL."""
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        raise ConnectFailed(f"{url}: {exc}") from exc
    except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
        raise TimedOut(f"{url}: no answer in time") from exc
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as exc:
        raise ValueError(f"not an http(s) URL: {url!r}") from exc  # ours, not the server's
    except (aiohttp.ClientError, OSError) as exc:
        raise HTTPFailed(f"{url}: {type(exc).__name__}: {exc}") from exc
