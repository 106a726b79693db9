"""Errors on the Anthropic routes: `{"type": "error", "error": {"type", "message"}}`,
with Anthropic's statuses and types, registered for `/v1/messages` (gateway/errors.py).

The gateway's own errors map onto Anthropic's: a full gateway (too many answers
generating) or an engine that is down is `overloaded_error` (529, with `retry-after`),
which Claude Code and the SDK retry with backoff; an engine timeout `timeout_error`
(504); a request that cannot be served `invalid_request_error` (400, never retried
by the SDK).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from gateway.errors import APIError

PREFIX = "/v1/messages"
OVERLOADED = 529

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    410: "permission_error",  # the session has ended: its key may no longer generate
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    OVERLOADED: "overloaded_error",
}
# gateway statuses that Anthropic's API answers otherwise
_STATUS = {409: 400, 422: 400, 503: OVERLOADED}
_STATUS_BY_CODE = {"too_many_pending_requests": OVERLOADED, "engine_timeout": 504}


class AnthropicErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error shape, as the OpenAPI document declares it for these routes."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["error"]
    error: AnthropicErrorDetail


@dataclass(frozen=True, slots=True)
class AnthropicError:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def anthropic_error(exc: APIError) -> AnthropicError:
    status = _STATUS_BY_CODE.get(exc.code or "", _STATUS.get(exc.status, exc.status))
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    headers = dict(exc.headers)
    retry = exc.retryable or status in (429, 500, 504, OVERLOADED)
    if status in (429, OVERLOADED):
        headers.setdefault("retry-after", "1")
    headers["x-should-retry"] = "true" if retry else "false"
    body = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return AnthropicError(status, body, headers)


def anthropic_error_response(exc: APIError) -> JSONResponse:
    err = anthropic_error(exc)
    return JSONResponse(err.body, err.status, headers=err.headers)
