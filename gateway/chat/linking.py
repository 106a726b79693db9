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


def _prefix_hashes(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, at_assistants: bool
) -> list[str]:
    """One pass over the messages: the hash after each assistant message (or only the
    last), so a long conversation costs O(N) to hash, not O(N^2)."""
    h = hashlib.sha256()
    h.update(json.dumps(tools or [], sort_keys=True, default=str).encode())
    out = []
    for m in messages:
        h.update(json.dumps(canonical(m), sort_keys=True, default=str).encode())
        h.update(b"\x00")
        if at_assistants and m.get("role") == "assistant":
            out.append(h.hexdigest()[:40])
    return out if at_assistants else [h.hexdigest()[:40]]


def conversation_hash(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> str:
    return _prefix_hashes(messages, tools, at_assistants=False)[0]


def candidate_parent_hashes(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[str]:
    """Hashes of every prefix ending in an assistant message, longest first."""
    return _prefix_hashes(messages, tools, at_assistants=True)[::-1]


def answer_positions(messages: list[dict[str, Any]]) -> list[int]:
    """Index of each assistant message, longest prefix first: the i-th of
    `candidate_parent_hashes` ends at message `answer_positions(...)[i]`."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"][::-1]


def tokens_continue(parent_prompt: list[int], parent_output: list[int], prompt: list[int]) -> bool:
    """Does this prompt start with exactly the tokens the parent saw and produced?"""
    prefix = parent_prompt + parent_output
    return len(prompt) >= len(prefix) and prompt[: len(prefix)] == prefix
