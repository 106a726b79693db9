"""DeepSeek V3 tool calls: its own special tokens around fenced JSON arguments.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Several `tool▁call` blocks inside one `tool▁calls` block are parallel calls.
"""

from __future__ import annotations

import re

from gateway.chat.tool_parsers.base import BlockToolParser, arguments_json, register_tool_parser

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
_CALL = re.compile(
    r"<｜tool▁call▁begin｜>(\w+)<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*?)\n```<｜tool▁call▁end｜>",
    re.DOTALL,
)
# How one call is written, for the tool prompt of a template that shows no tools.
CALL_FORMAT = (
    f"{CALLS_BEGIN}<｜tool▁call▁begin｜>function<｜tool▁sep｜><function-name>\n"
    f"```json\n<args-json-object>\n```<｜tool▁call▁end｜>{CALLS_END}"
)


@register_tool_parser("deepseek_v3", detect=lambda template: "tool▁calls▁begin" in template)
class DeepSeekV3ToolParser(BlockToolParser):
    open = CALLS_BEGIN
    close = CALLS_END
    call_format = CALL_FORMAT

    def parse_block(self, body: str) -> list[tuple[str, str]] | None:
        calls = []
        for m in _CALL.finditer(body):
            arguments = arguments_json(m.group(3))
            if m.group(1) != "function" or arguments is None:
                return None
            calls.append((m.group(2).strip(), arguments))
        if not calls or _CALL.sub("", body).strip():
            return None
        return calls
