"""Helpers for the Anthropic Messages tests: requests, SSE parsing, the error shape."""

from __future__ import annotations

import json
from typing import Any

import httpx

BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"],
    },
}


def anthropic_headers(key: str, how: str = "x-api-key") -> dict[str, str]:
    auth = {"x-api-key": key} if how == "x-api-key" else {"Authorization": f"Bearer {key}"}
    return {
        **auth,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "interleaved-thinking-2025-05-14,fine-grained-tool-streaming",
    }


def post_messages(
    http: httpx.Client, url: str, key: str, body: dict[str, Any], path: str = "/v1/messages"
) -> httpx.Response:
    """`url`: a gateway's OpenAI base URL (`.../v1`), as `BackgroundGateway.url` gives."""
    return http.post(f"{root(url)}{path}", headers=anthropic_headers(key), json=body)


def root(url: str) -> str:
    """The base URL Anthropic clients take (they add `/v1/messages` themselves)."""
    return url.removesuffix("/v1")


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event; the name must match data.type."""
    out = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"], chunk
        out.append((lines["event"], data))
    return out


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """Anthropic's error shape: {"type": "error", "error": {"type", "message"}}."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == kind, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]
