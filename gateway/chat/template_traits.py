"""What a chat template expects of the messages it renders, read from its text.

Templates disagree on small things that decide whether they render at all, or render
what the model saw: DeepSeek V3's concatenates tool arguments as a string and tells a
tool-call turn by `content is none`; Qwen3's reads `reasoning_content` and parses
arguments given as an object. Messages are shaped to suit (template.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NONE_CONTENT = re.compile(r"content'?\]?\s+is\s+none")


@dataclass(frozen=True, slots=True)
class TemplateTraits:
    tools: bool  # renders the `tools` definitions itself
    tool_calls: bool  # renders assistant `tool_calls` itself
    arguments_as_text: bool  # wants tool arguments as a JSON string, not an object
    none_content: bool  # a turn of only tool calls must have `content: None`
    reasoning_content: bool  # reads `reasoning_content` of earlier assistant turns

    @classmethod
    def of(cls, template: Any) -> TemplateTraits:
        t = template if isinstance(template, str) else ""
        tool_calls = "tool_calls" in t
        return cls(
            tools="tools" in t,
            tool_calls=tool_calls,
            arguments_as_text=tool_calls and "tojson" not in t,
            none_content=bool(_NONE_CONTENT.search(t)),
            reasoning_content="reasoning_content" in t,
        )
