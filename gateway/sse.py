"""Server-sent events, as the OpenAI SDKs read them: `data: {json}\\n\\n` ... `data: [DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi.responses import StreamingResponse

from gateway import json_codec
from gateway.errors import APIError, error_body

SSE_DONE = b"data: [DONE]\n\n"
_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def sse_event(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json_codec.dumps(data) + b"\n\n"


def sse_error(exc: APIError) -> bytes:
    """An error after the stream began: the SDKs raise it from the `error` key."""
    return sse_event(error_body(exc.status, exc.message, exc.code, exc.param))


def sse_response(body: AsyncIterator[bytes] | Iterable[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=_HEADERS)
