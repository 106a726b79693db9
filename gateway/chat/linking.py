"""Finding a turn's parent: the earlier completion whose messages + answer prefix this request.

Messages are compared in a canonical form (role, text, tool calls with parsed
arguments) because clients re-serialise what they send back: an SDK adds
`refusal: null`, turns content into parts, or re-dumps tool arguments.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway import json_codec
from gateway.chat.template import normalize_message


def canonical(message: dict[str, Any]) -> tuple[str, str, list[Any], str | None]:
    """What of a message counts for linking: role, text (an answer's stripped), tool
    calls as (name, parsed arguments), and the id a tool result answers."""
    m = normalize_message(message)
    calls = [
        (tc["function"]["name"], tc["function"]["arguments"])
        for tc in m.get("tool_calls", []) or []
    ]
    content = m["content"]
    return (
        m["role"],
        content.strip() if m["role"] == "assistant" else content,
        calls,
        m.get("tool_call_id"),
    )


def _framed(message: dict[str, Any]) -> bytes:
    """A message's canonical form as unambiguous bytes: length-prefixed text fields,
    tool calls as sorted-key JSON. The text goes in as it is (no JSON escaping of a
    tool output's kilobytes)."""
    role, content, calls, call_id = canonical(message)
    text = content.encode("utf-8", "surrogatepass")
    tail = json_codec.dumps_sorted(calls) if calls else b""
    ident = (call_id or "").encode("utf-8", "surrogatepass")
    head = f"{role}\x1f{len(text)}\x1f{len(tail)}\x1f{len(ident)}\x1f".encode()
    return b"".join((head, text, tail, ident))


class ConversationHash:
    """One pass over a request's messages: the hash after each assistant message (the
    parent candidates), and the running state, so that the hash of the request plus a
    new answer costs only the answer: a long conversation is hashed once per turn,
    not once per use."""

    def __init__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None):
        h = hashlib.sha256(json_codec.dumps_sorted(tools or []))
        answers: list[str] = []
        for m in messages:
            h.update(_framed(m))
            if m.get("role") == "assistant":
                answers.append(h.hexdigest()[:40])
        self._state = h
        self.candidates = answers[::-1]  # longest prefix first

    def with_answer(self, message: dict[str, Any]) -> str:
        """The hash a later turn continuing `message` (this request's answer) finds it by."""
        h = self._state.copy()
        h.update(_framed(message))
        return h.hexdigest()[:40]


def answer_positions(messages: list[dict[str, Any]]) -> list[int]:
    """Index of each assistant message, longest prefix first: the i-th of
    `ConversationHash.candidates` ends at message `answer_positions(...)[i]`."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant"][::-1]


def tokens_continue(parent_prompt: list[int], parent_output: list[int], prompt: list[int]) -> bool:
    """Does this prompt start with exactly the tokens the parent saw and produced?"""
    prefix = parent_prompt + parent_output
    return len(prompt) >= len(prefix) and prompt[: len(prefix)] == prefix
