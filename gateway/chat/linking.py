"""Finding a turn's parent: the earlier completion whose messages + answer prefix this request.

Messages are compared in a canonical form (role, text, tool calls with parsed
arguments) because clients re-serialise what they send back: an SDK adds
`refusal: null`, turns content into parts, or re-dumps tool arguments.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gateway.chat.template import normalize_message


def canonical(message: dict[str, Any]) -> Any:
    m = normalize_message(message)
    calls = [
        (tc["function"]["name"], tc["function"]["arguments"])
        for tc in m.get("tool_calls", []) or []
    ]
    return [
        m["role"],
        m["content"].strip() if m["role"] == "assistant" else m["content"],
        calls,
        m.get("tool_call_id"),
    ]


def conversation_hash(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(tools or [], sort_keys=True, default=str).encode())
    for m in messages:
        h.update(json.dumps(canonical(m), sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()[:40]


def candidate_parent_hashes(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[str]:
    """Hashes of every prefix ending in an assistant message, longest first."""
    out = []
    for i in range(len(messages) - 1, 0, -1):
        if messages[i].get("role") == "assistant":
            out.append(conversation_hash(messages[: i + 1], tools))
    return out


def tokens_continue(parent_prompt: list[int], parent_output: list[int], prompt: list[int]) -> bool:
    """Does this prompt start with exactly the tokens the parent saw and produced?"""
    prefix = parent_prompt + parent_output
    return len(prompt) >= len(prefix) and prompt[: len(prefix)] == prefix
