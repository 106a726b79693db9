"""Qwen3-Coder tool calls: XML inside `<tool_call>` tags.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter's value is JSON when it parses as JSON (numbers, booleans, objects), else
the text itself. A function with no parameters is a call with `{}`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.chat.tool_parsers.base import BlockToolParser, register_tool_parser
from gateway.chat.tool_parsers.hermes import TOOL_CLOSE, TOOL_OPEN

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _value(text: str) -> Any:
    text = text.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _arguments(body: str) -> dict[str, Any] | None:
    args = {m.group(1).strip(): _value(m.group(2)) for m in _PARAMETER.finditer(body)}
    if _PARAMETER.sub("", body).strip():  # text that is not a parameter
        return None
    return args


@register_tool_parser("qwen3_coder", detect=lambda template: "<function=" in template)
class Qwen3CoderToolParser(BlockToolParser):
    open = TOOL_OPEN
    close = TOOL_CLOSE

    def parse_block(self, body: str) -> list[tuple[str, str]] | None:
        calls = []
        for m in _FUNCTION.finditer(body):
            args = _arguments(m.group(2))
            if args is None:
                return None
            calls.append((m.group(1).strip(), json.dumps(args, ensure_ascii=False)))
        if not calls or _FUNCTION.sub("", body).strip():
            return None
        return calls
