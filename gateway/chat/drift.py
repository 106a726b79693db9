"""Token drift: where a turn's prompt stops continuing its parent's prompt + output, and why.

Templates do not always render an earlier answer as the model wrote it (Qwen3's drops
earlier `<think>` blocks, clients re-serialise tool arguments, whitespace is trimmed);
then a multi-turn episode cannot be trained as one sequence. Only computed when the
tokens do differ (gateway/store/delta.py's `continued_length` says where).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gateway.chat.families import FAMILIES

_WS = re.compile(r"\s+")


def drift(
    parent_prompt: list[int],
    parent_output: list[int],
    prompt: list[int],
    at: int,
    decode: Callable[[list[int]], str],
    has_tool_calls: bool,
) -> dict[str, Any]:
    """{"at": `at`, the first token where `prompt` leaves the parent's, "cause": ...}.

    cause: `reasoning_dropped` (the parent's reasoning is not in the new prompt),
    `whitespace` (the texts differ only in whitespace), `tool_arguments` (the answer
    was a tool call, written back differently), or None (not known).
    """
    before = parent_prompt + parent_output
    start = max(0, at - 2)  # from just before: a think block may open at `at - 1`
    old_text, new_text = decode(before[start:]), decode(prompt[start:])
    cause = None
    blocks = [f.reasoning_block for f in FAMILIES.values() if f.reasoning_block is not None]
    thoughts = [t for block in blocks for t in block.findall(old_text)]
    if any(t.strip() and t not in new_text for t in thoughts):
        cause = "reasoning_dropped"
    elif _WS.sub("", new_text).startswith(_WS.sub("", old_text)):
        cause = "whitespace"
    elif has_tool_calls and at >= len(parent_prompt):
        cause = "tool_arguments"
    return {"at": at, "cause": cause}
