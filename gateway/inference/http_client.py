"""HTTP/1.1 to external engines: kept-alive connections on asyncio, parsed by httptools.

Every completion the gateway serves from an external engine is one request here, so
its CPU cost is paid per turn. A general client spends most of it on what an engine
call does not use: URL objects, cookie jars, header multidicts, payload registries,
tracing hooks, a task per request. Here a request is one write of bytes already framed
(the head for a URL and header set is built once), and the response goes through
httptools, the C parser uvicorn serves with, into a buffer the caller awaits. Per
request at one session behind an instant engine this is about a third of aiohttp's
CPU (docs/benchmarks.md, `python -m bench.engine_client`).

What engines need is all here: keep-alive pooling bounded by `max_connections`, a
connect timeout and a deadline per request, chunked and length-framed bodies (and ones
that end with the connection), streamed bodies read by server-sent event with flow
control, and plain or TLS connections. Callers see `Reply`, a stream's connection and
`ConnectFailed` / `TimedOut` / `HTTPFailed`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

# a stream's unread bytes above which the socket is no longer read (flow control)
_HIGH_WATER = 4 * 1024 * 1024

# A request body: bytes, or its parts in order, written to the socket as they are (a
# long prompt's JSON is kept in parts, gateway/token_ids.py: joining them copied it)
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


# (scheme, host, port): the pool a connection belongs to
Key = tuple[str, str, int]


class _Connection(asyncio.Protocol):
    """One kept-alive connection; it carries one request at a time. A stream's reply is
    read from it: `status`, then `read()` (whole) or `events()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: Key, url: str):
        self.loop = loop
        self.key = key
        self.url = url  # the first URL it was opened for (error messages)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.status = 0
        self._parser = httptools.HttpResponseParser(self)
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._headers_done = False
        self._complete = False
        self._framed = False  # the response said how its body ends (length or chunks)
        self._keep_alive = False
        self._error: HTTPFailed | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPFailed(f"{self.url}: malformed response: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headers_done and not self._complete and not self._framed and exc is None:
            self._complete = True  # a body that ends with the connection has ended
            self._wake()
        elif not self._complete:
            reason = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
            self._fail(HTTPFailed(f"{self.url}: {reason}"))

    # ---- httptools callbacks ---------------------------------------------------------
    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # (asked now: the parser forgets it once the message is over)
        self._keep_alive = self._parser.should_keep_alive()
        self._complete = True
        self._wake()

    # ---- one exchange ----------------------------------------------------------------
    def send(self, data: list[bytes | memoryview], deadline: float) -> None:
        """Start a request (its bytes) that must be answered by `deadline` (loop time)."""
        assert self.transport is not None
        self.status = 0
        self._headers_done = self._complete = self._framed = self._keep_alive = False
        self._deadline = self.loop.call_at(deadline, self._expire)
        self.transport.writelines(data)

    async def headers(self) -> int:
        while not self._headers_done:
            await self._wait()
        return self.status

    async def read(self) -> bytes:
        while not self._complete:
            await self._wait()
        body = b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            while self._body:
                chunk = self._body.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered < _HIGH_WATER // 2:
                    self._paused = False
                    if self.transport is not None:
                        self.transport.resume_reading()
                yield chunk
            if self._complete:
                return
            await self._wait()

    async def events(self) -> AsyncIterator[str]:
        """The `data:` payloads of a server-sent event stream, up to `[DONE]`."""
        rest = b""
        async for chunk in self.chunks():
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    payload = line[5:].decode("utf-8", errors="replace").strip()
                    if payload == "[DONE]":
                        return
                    yield payload
        payload = rest[5:].decode("utf-8", errors="replace").strip()
        if rest.startswith(b"data:") and payload != "[DONE]":
            yield payload

    def reusable(self) -> bool:
        """Whole response read, and both sides keep the connection: it may go back."""
        return (
            self._complete and self._keep_alive and not (self.closed or self._body or self._error)
        )

    def finish(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def close(self) -> None:
        self.finish()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ---- waiting ---------------------------------------------------------------------
    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: HTTPFailed) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _expire(self) -> None:
        self._deadline = None
        self._fail(TimedOut(f"{self.url}: no answer in time"))
        self.close()


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
        self._headers = _header_lines(headers)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._idle: dict[Key, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        # a URL's pool, and the first line + Host header its requests start with
        self._targets: dict[str, tuple[Key, bytes]] = {}

    async def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._slots = asyncio.Semaphore(self._max_connections)

    async def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        self._loop = None
        self._slots = None

    async def get(self, url: str, *, timeout: float | None = None) -> Reply:
        return await self._call(b"GET ", url, None, None, timeout)

    async def post(
        self,
        url: str,
        body: Body,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Reply:
        return await self._call(b"POST ", url, body, headers, timeout)

    async def _call(
        self,
        method: bytes,
        url: str,
        body: Body | None,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> Reply:
        slots = self._started()
        async with slots:
            conn = await self._exchange(method, url, body, headers, timeout)
            try:
                status = await conn.headers()
                content = await conn.read()
            except BaseException:
                self._discard(conn)
                raise
            self._release(conn)
            return Reply(status, content)

    @asynccontextmanager
    async def stream(
        self, url: str, body: Body, *, headers: dict[str, str] | None = None
    ) -> AsyncIterator[_Connection]:
        slots = self._started()
        async with slots:
            conn = await self._exchange(b"POST ", url, body, headers, None)
            try:
                await conn.headers()
                yield conn
            except BaseException:
                self._discard(conn)
                raise
            self._release(conn)

    # ---- connections -----------------------------------------------------------------
    def _started(self) -> asyncio.Semaphore:
        if self._slots is None:
            raise RuntimeError("EngineHTTP.start() was not awaited")
        return self._slots

    async def _exchange(
        self,
        method: bytes,
        url: str,
        body: Body | None,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> _Connection:
        """A connection with the request written to it (the caller reads the reply)."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _target(url)
        key, head = target
        data: list[bytes | memoryview] = [method, head, self._headers]
        if headers:
            data.append(_header_lines(headers))
        if body is None:
            data.append(b"\r\n")
        elif isinstance(body, bytes):
            data += [b"Content-Length: %d\r\n\r\n" % len(body), body]
        else:
            data.append(b"Content-Length: %d\r\n\r\n" % sum(map(len, body)))
            data += body
        conn = self._idle_connection(key) or await self._connect(key, url)
        assert self._loop is not None
        conn.send(data, self._loop.time() + (self._timeout_s if timeout is None else timeout))
        return conn

    def _idle_connection(self, key: Key) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self._open.discard(conn)
        return None

    async def _connect(self, key: Key, url: str) -> _Connection:
        scheme, host, port = key
        assert self._loop is not None
        loop = self._loop
        tls = ssl.create_default_context() if scheme == "https" else None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, key, url), host, port, ssl=tls
                )
        except TimeoutError as exc:
            raise TimedOut(f"{url}: no connection within {self._connect_timeout_s:g} s") from exc
        except OSError as exc:
            raise ConnectFailed(f"{url}: {exc}") from exc
        self._open.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.finish()
        if conn.reusable():
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)


def _target(url: str) -> tuple[Key, bytes]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host = parts.netloc.rpartition("@")[2]
    head = f"{path} HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1")
    return (parts.scheme, parts.hostname, port), head


def _header_lines(headers: dict[str, str]) -> bytes:
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n") or not name:
            raise ValueError(f"bad header {name!r}")
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")
