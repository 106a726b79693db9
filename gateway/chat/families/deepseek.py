"""DeepSeek V3 tool calls (its special tokens around fenced JSON) and DeepSeek-R1 reasoning.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Several `tool▁call`s in one block are parallel calls. V3's template shows calls, not
tools, so the tool prompt asks for this form. `deepseek_r1` (chosen by name only): the
answer starts inside `<think>` (R1 often omits the tag).
"""

from __future__ import annotations

import re

from gateway.chat.families import Family, register_family
from gateway.chat.families.qwen3 import ThinkReasoningParser
from gateway.chat.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    BlockToolParser,
    Calls,
    arguments_json,
    each_match,
)

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


def _call(m: re.Match[str]) -> tuple[str, str] | None:
    arguments = arguments_json(m.group(3))
    return (
        None if m.group(1) != "function" or arguments is None else (m.group(2).strip(), arguments)
    )


@TOOL_PARSERS.register("deepseek_v3")
class DeepSeekV3ToolParser(BlockToolParser):
    open = CALLS_BEGIN
    close = CALLS_END
    call_format = CALL_FORMAT

    def parse_block(self, body: str) -> Calls | None:
        return each_match(_CALL, body, _call)


@REASONING_PARSERS.register("deepseek_r1")
class DeepSeekR1ReasoningParser(ThinkReasoningParser):
    starts_inside = True


register_family(
    Family(
        "deepseek",
        tool_parser="deepseek_v3",
        reasoning_parser="deepseek_r1",  # not detected: `--reasoning-parser deepseek_r1`
        teaches_tools=lambda template: "tool▁calls▁begin" in template,
    )
)
