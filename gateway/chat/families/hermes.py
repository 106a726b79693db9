"""Hermes / Qwen tool calls: JSON inside `<tool_call>...</tool_call>` tags, in ChatML.

- Hermes / Qwen: one JSON object `{"name": ..., "arguments": {...}}` per tag; several
  tags are parallel calls;
- SmolLM2: a JSON list of such objects inside one tag.

This is also the form the gateway asks for when a model's own template knows no tools
(gateway/chat/tools.py). Text outside the tags is content. Generic: the tags appear in
other families' templates too (Qwen3-Coder's), so the others are tried first.
"""

from __future__ import annotations

import json

from gateway.chat.families import Family, register_family
from gateway.chat.parsers import TOOL_PARSERS, BlockToolParser, arguments_json

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def parse_json_calls(body: str) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) of each `{"name", "arguments"|"parameters"}` object in a
    JSON object or list; None if it is not valid."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = arguments_json(item.get("arguments", item.get("parameters")))
        if arguments is None:
            return None
        calls.append((item["name"], arguments))
    return calls


@TOOL_PARSERS.register("hermes")
class HermesToolParser(BlockToolParser):
    open = TOOL_OPEN
    close = TOOL_CLOSE

    def parse_block(self, body: str) -> list[tuple[str, str]] | None:
        return parse_json_calls(body)


register_family(
    Family(
        "hermes",
        tool_parser="hermes",
        teaches_tools=lambda template: TOOL_OPEN in template,
        generic=True,
        stop_tokens=("<|im_end|>", "<|endoftext|>"),  # ChatML's turn end, and the text's
    )
)
