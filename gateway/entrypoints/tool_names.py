"""Tool names as OpenAI's and Anthropic's APIs take them: `^[a-zA-Z0-9_-]{1,64}$`.

A tool's name goes into the prompt: the chat template writes it, some templates bare
rather than as JSON. Templates render in Jinja's sandbox with the tools as data, so a
name is never template code (`{{7*7}}` would be written as it is); but a name holding a
special token's text (`<|im_end|>`), a newline or a tag could shape the tool block the
model reads. Both APIs refuse such names, so no client written for them sends one; the
gateway refuses them too, with a 400 naming the field, before anything is rendered
(docs/security.md, "Template injection").
"""

from __future__ import annotations

import re
from typing import Any

from gateway.errors import APIError

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def check_tool_names(tools: Any, param: str = "tools") -> None:
    """400 `invalid_tool_name` for the first tool whose name the APIs would refuse
    (a chat tool's `function.name`, a Responses or Anthropic tool's `name`)."""
    if not isinstance(tools, list):
        return
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function")
        if isinstance(fn, dict) and "name" in fn:
            name, where = fn["name"], f"{param}[{i}].function.name"
        elif "name" in tool:
            name, where = tool["name"], f"{param}[{i}].name"
        else:
            continue  # a built-in tool, or one the endpoint refuses for another reason
        if not (isinstance(name, str) and NAME.fullmatch(name)):
            shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
            raise APIError(
                400,
                f"{where} must be 1 to 64 letters, digits, underscores or dashes "
                f"(^[a-zA-Z0-9_-]{{1,64}}$), got {shown}.",
                code="invalid_tool_name",
                param=where,
            )
