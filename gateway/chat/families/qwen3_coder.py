"""Qwen3-Coder tool calls: XML inside Hermes' `<tool_call>` tags.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter's value is JSON when it parses as JSON, else the text itself.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.chat.families import Family, register_family
from gateway.chat.families.hermes import HermesToolParser
from gateway.chat.parsers import TOOL_PARSERS, Calls, each_match

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _value(text: str) -> Any:
    text = text.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _call(m: re.Match[str]) -> tuple[str, str] | None:
    body = m.group(2)
    args = {p.group(1).strip(): _value(p.group(2)) for p in _PARAMETER.finditer(body)}
    if _PARAMETER.sub("", body).strip():  # text that is not a parameter
        return None
    return m.group(1).strip(), json.dumps(args, ensure_ascii=False)


@TOOL_PARSERS.register("qwen3_coder")
class Qwen3CoderToolParser(HermesToolParser):  # Hermes' tags, XML inside
    def parse_block(self, body: str) -> Calls | None:
        return each_match(_FUNCTION, body, _call)


register_family(
    Family(
        "qwen3_coder",
        tool_parser="qwen3_coder",
        teaches_tools=lambda template: "<function=" in template,
    )
)
