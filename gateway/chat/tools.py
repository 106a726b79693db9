"""Tools for chat templates that know nothing about tools (SmolLM2's, for one): never
dropped silently, but described in a Hermes-style system block asking for `<tool_call>`
answers, and earlier calls written back in that form (a later prompt continues the
tokens the model produced).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.chat.families.hermes import TOOL_CLOSE, TOOL_OPEN

# the parser for the calls this prompt asks for (unless a parser's `call_format` says)
PROMPT_TOOL_PARSER = "hermes"

_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_FOOTER = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    f'{TOOL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{TOOL_CLOSE}'
)
_OTHER_FOOTER = "\n</tools>\n\nFor each function call, write:\n"


def tool_name(tool: dict[str, Any]) -> str | None:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def forced_tool(tool_choice: Any) -> str | None:
    """The function name a `tool_choice` object forces, if any."""
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
        if isinstance(tool_choice.get("name"), str):  # Responses-API style
            return tool_choice["name"]
    return None


def inline_tools(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_choice: Any = None,
    call_format: str | None = None,
    inline_calls: bool = True,
) -> list[dict[str, Any]]:
    """Normalised messages -> messages a tool-less template renders faithfully
    (`inline_calls=False`: it writes earlier calls itself, as DeepSeek V3's does).
    `call_format`: how the model writes one call (None: the Hermes form)."""
    out = []
    for m in messages:
        if inline_calls and m.get("tool_calls"):  # as the model was asked to write them
            calls = "\n".join(
                f"{TOOL_OPEN}\n{json.dumps(tc['function'], ensure_ascii=False)}\n{TOOL_CLOSE}"
                for tc in m["tool_calls"]  # normalised: {"name", "arguments"}, in that order
            )
            content = m["content"]
            m = {**m, "content": f"{content}\n{calls}" if content else calls}
        out.append(m)
    if tools:
        footer = _FOOTER if call_format is None else _OTHER_FOOTER + call_format
        block = _HEADER + json.dumps(tools, ensure_ascii=False) + footer
        forced = forced_tool(tool_choice)
        if forced:
            block += f"\n\nYou must call the function `{forced}`."
        elif tool_choice == "required":
            block += "\n\nYou must call at least one function."
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def check_tool_choice(tool_choice: Any, tools: list[dict[str, Any]] | None) -> None:
    """400/422 for a `tool_choice` that cannot be honoured with these `tools`."""
    from gateway.errors import APIError

    def refused(status: int, message: str, code: str) -> APIError:
        return APIError(status, message, code=code, param="tool_choice")

    if isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
        raise refused(
            400,
            f"tool_choice must be 'auto', 'none', 'required' or a function, got {tool_choice!r}.",
            "invalid_tool_choice",
        )
    if tool_choice in (None, "auto", "none"):
        return
    if not tools:
        raise refused(422, "tool_choice needs `tools` to choose from.", "tool_choice_without_tools")
    forced = forced_tool(tool_choice)
    if forced is not None and forced not in {tool_name(t) for t in tools}:
        message = f"tool_choice names the function {forced!r}, which is not in `tools`."
        raise refused(422, message, "unknown_tool")
