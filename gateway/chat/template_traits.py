"""What a chat template expects of the messages it renders, read from its text, and
`normalize_message`, which shapes messages to suit (its plain form is what linking.py
compares). Templates disagree on what decides whether they render at all, or render
what the model saw: DeepSeek V3's wants tool arguments as a string and a tool-call
turn's `content` None; Qwen3's reads `reasoning_content` and arguments as an object.
"""

from __future__ import annotations

import contextlib
import json
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


_TEXT_PARTS = ("text", "input_text", "output_text")


def text_of(content: Any) -> str:
    """OpenAI content may be None, a string, or a list of parts; templates want a string."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(
            part if isinstance(part, str) else str(part.get("text", ""))
            for part in content
            if isinstance(part, str) or (isinstance(part, dict) and part.get("type") in _TEXT_PARTS)
        )
    return content if isinstance(content, str) else str(content)


_PLAIN = TemplateTraits(False, False, False, False, False)  # linking.py's canonical form


def normalize_message(message: dict[str, Any], traits: TemplateTraits = _PLAIN) -> dict[str, Any]:
    """A message in the shape HF chat templates expect (this template, given `traits`)."""
    role = message.get("role")
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": text_of(message.get("content")),
    }
    tool_calls = message.get("tool_calls")
    if tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.get("id"),
                "type": "function",
                "function": {
                    "name": fn.get("name"),
                    "arguments": _arguments(fn.get("arguments"), traits.arguments_as_text),
                },
            }
            for tc in tool_calls
            for fn in [tc.get("function", {})]
        ]
        if traits.none_content and not out["content"]:
            out["content"] = None
    reasoning = message.get("reasoning_content")
    if role == "assistant" and traits.reasoning_content and isinstance(reasoning, str):
        out["reasoning_content"] = reasoning
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None or traits.none_content:  # see ChatRenderer._render_normalized
            out["tool_call_id"] = call_id
    if message.get("name"):
        out["name"] = message["name"]
    return out


def _arguments(arguments: Any, as_text: bool) -> Any:
    """Parsed JSON (text that is not JSON stays text); `as_text`: a JSON string. A call
    with no arguments has `{}`."""
    if arguments is None or arguments == "":
        arguments = {}
    if as_text:
        return arguments if isinstance(arguments, str) else json.dumps(arguments)
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            return json.loads(arguments)
    return arguments
