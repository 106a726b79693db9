"""Hermes / Qwen tool calls: JSON inside `<tool_call>...</tool_call>` tags, in ChatML: one
`{"name", "arguments"}` per tag, or SmolLM2's list of them, and the form the gateway's
tool prompt asks for (tools.py). Generic: other families' templates (Qwen3-Coder's)
have the tags too, so those are tried first.
"""

from __future__ import annotations

import json

from gateway.chat.families import Family, register_family
from gateway.chat.parsers import TOOL_PARSERS, BlockToolParser, Calls, json_call

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def parse_json_calls(body: str) -> Calls | None:
    """The calls of a JSON call object or list of them; None if it is not valid."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    calls = [json_call(item) for item in (data if isinstance(data, list) else [data])]
    return None if None in calls else calls


@TOOL_PARSERS.register("hermes")
class HermesToolParser(BlockToolParser):
    open = TOOL_OPEN
    close = TOOL_CLOSE

    parse_block = staticmethod(parse_json_calls)


register_family(
    Family(
        "hermes",
        tool_parser="hermes",
        teaches_tools=lambda template: TOOL_OPEN in template,
        generic=True,
        stop_tokens=("<|im_end|>", "<|endoftext|>"),  # ChatML's turn end, and the text's
    )
)
