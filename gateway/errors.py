"""Errors in the shape of the API that was called.

Every failure answers OpenAI's `{"error": {message, type, param, code}}`, except on the
routes of an API with a shape of its own, registered by path prefix with
`register_error_shape` (the Anthropic Messages routes answer
`{"type": "error", "error": {type, message}}`). One hook serves every way an error
is made: an `APIError` raised by a handler, a body that does not validate, an unknown
path, an unexpected exception, a body over the size limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.reward_values import finite_reward

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    410: "session_ended",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retryable: bool | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        # Tell OpenAI SDKs not to retry what a retry cannot fix.
        self.retryable = retryable if retryable is not None else status in (429, 503)
        self.headers = headers or {}


# how long a client is asked to wait before retrying while the store is unavailable
STORE_RETRY_AFTER_S = 2


def store_unavailable(exc: BaseException) -> bool:
    """Is this the store failing (server down or restarting, connection lost, SQLite
    file read-only or its disk full), not a bug in a query?"""
    return isinstance(exc, (OperationalError, InterfaceError)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def store_unavailable_error(exc: BaseException) -> APIError:
    log.warning("store unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
    return APIError(
        503,
        "The session store is unavailable; nothing was recorded. Retry shortly.",
        code="store_unavailable",
        headers={"retry-after": str(STORE_RETRY_AFTER_S)},
    )


def as_api_error(exc: BaseException) -> APIError:
    """Any failure inside a request, as the error its client is told about."""
    if isinstance(exc, APIError):
        return exc
    if store_unavailable(exc):
        return store_unavailable_error(exc)
    if isinstance(exc, asyncio.CancelledError):
        return APIError(503, "the request was cancelled", code="cancelled")
    log.error("request failed", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(exc: APIError, path: str = "") -> JSONResponse:
    """The error as the API at `path` answers it (OpenAI's shape unless registered)."""
    if (registered := registered_shape(path)) is not None:
        return registered[1](exc)
    headers = {**exc.headers, "x-should-retry": "true" if exc.retryable else "false"}
    return JSONResponse(
        error_body(exc.status, exc.message, exc.code, exc.param), exc.status, headers=headers
    )


ErrorShape = Callable[[APIError], JSONResponse]
_SHAPES: list[tuple[str, ErrorShape, type]] = []  # (path prefix, shape, its pydantic model)


def register_error_shape(prefix: str, shape: ErrorShape, model: type) -> None:
    """Answer errors on the routes under `prefix` (e.g. "/v1/messages") with `shape`,
    declared in /openapi.json as `model` (gateway/api_schema.py)."""
    _SHAPES[:] = [s for s in _SHAPES if s[0] != prefix] + [(prefix, shape, model)]


def registered_shape(path: str) -> tuple[str, ErrorShape, type] | None:
    return next((s for s in _SHAPES if path == s[0] or path.startswith(s[0] + "/")), None)


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        msg, param = "Request body is not valid JSON.", None
    elif param:
        msg += f" (at {param})"
    return error_response(APIError(400, msg, code="invalid_request", param=param), request.url.path)


async def _answer(request: Request, exc: Exception) -> JSONResponse:
    """An APIError as it is; a store error (503 when the store is down), or a bug: 500."""
    return error_response(as_api_error(exc), request.url.path)


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(APIError(exc.status_code, str(exc.detail), code=None), request.url.path)


# The gateway's exception handlers, by class: given to FastAPI, and used as they are by
# the generating routes' dispatcher (gateway/entrypoints/hot_routes.py).
EXCEPTION_HANDLERS: dict[type[Exception], Callable[[Request, Any], Awaitable[JSONResponse]]] = {
    APIError: _answer,
    RequestValidationError: _validation,
    DBAPIError: _answer,
    StarletteHTTPException: _http,
}


def install_error_handlers(
    app: FastAPI, max_body_bytes: int, observe: Callable[[Any, int, float], None]
) -> None:
    for cls, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(cls, handler)
    app.add_middleware(_Guard, max_bytes=max_body_bytes, observe=observe)


def check_finite(value: float, param: str) -> float:
    number = finite_reward(value)
    if number is None:
        raise APIError(
            400,
            f"{param} must be a finite number, got {value!r}",
            code="invalid_reward",
            param=param,
        )
    return number


class _Guard:
    """Pure ASGI middleware, outermost, for what no handler answers: a request body over
    `max_bytes` is a 413, read no further; an unexpected exception is a 500 in the API's
    shape. It sees every response's status, so it also times each request (`observe`).

    Not `exception_handler(Exception)`: Starlette runs that one in its outermost
    middleware and re-raises afterwards, which makes uvicorn drop the keep-alive
    connection under the client's feet. Answering here keeps the connection usable."""

    def __init__(
        self, app: Any, max_bytes: int, observe: Callable[[Any, int, float], None]
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.observe = observe  # (scope, status, seconds) of every HTTP request

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began, status = time.perf_counter(), 0  # the response's status, once it starts

        async def send_tracked(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._limited(scope, receive, send_tracked)
        except Exception as exc:
            if status:
                raise
            answer = error_response(as_api_error(exc), scope.get("path", ""))
            await answer(scope, receive, send_tracked)
        finally:
            self.observe(scope, status or 500, time.perf_counter() - began)

    async def _limited(self, scope: Any, receive: Any, send: Any) -> None:
        """The app, once the body is known to fit (a 413 is raised, answered above)."""
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is None:  # no length (a chunked upload): read it here, up to the limit
            body = bytearray()
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                body += message.get("body", b"")
                self._fits(len(body))
                if not message.get("more_body", False):
                    break
            receive = _replay(bytes(body), receive)
        elif declared.isdigit():  # (a length within the limit: the server enforces it)
            self._fits(int(declared))
        await self.app(scope, receive, send)

    def _fits(self, size: int) -> None:
        if size > self.max_bytes:
            raise APIError(
                413,
                f"The request body is larger than this gateway accepts ({self.max_bytes} bytes).",
                code="request_too_large",
            )


def _replay(body: bytes, receive: Any) -> Any:
    """`receive` that hands out `body` first (read already), then what the client sends."""
    first = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Any:
        return first.pop() if first else await receive()

    return replay
