"""`POST /v1/responses` shapes: the request body, its input as chat messages, and the
`Response` and output items answered (plain dicts in the `openai` package's shapes).

Unknown request fields (`store`, `include`, `reasoning`, `text`, `truncation`,
`metadata`, ...) are accepted and ignored.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from gateway.chat.events import ToolCall
from gateway.chat.template_traits import text_of
from gateway.chat.tools import forced_tool
from gateway.entrypoints.openai.protocol import OpenAIRequest
from gateway.errors import APIError

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")


class ResponsesRequest(OpenAIRequest):
    input: str | Annotated[list[dict[str, Any]], Field(min_length=1)]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)


# ---- Responses input -> chat messages ----------------------------------------------------
def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


def to_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """Responses input items -> chat messages, as the chat path renders and links them.

    Consecutive `function_call` items (and one right after an assistant message) become
    the tool calls of one assistant message, as the model produced them in one answer.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    reasoning: str | None = None  # a reasoning item's text, for the assistant turn it led to
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind in (None, "message"):
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise _bad_input(i, f"role must be user/system/developer/assistant, got {role!r}")
            messages.append({"role": role, "content": text_of(item.get("content"))})
            if role == "assistant" and reasoning is not None:
                messages[-1]["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call":
            arguments = item.get("arguments") or "{}"
            call = ToolCall(item.get("call_id"), item.get("name"), arguments).to_openai()
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if reasoning is not None:
                    messages[-1]["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = text_of(output) if isinstance(output, list) else json.dumps(output)
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
            )
        elif kind == "reasoning":  # goes with the assistant turn that follows it
            parts = (item.get("content") or []) + (item.get("summary") or [])
            reasoning = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        elif kind == "item_reference":
            continue  # nothing the model's template can show
        else:
            raise _bad_input(i, f"input items of type {kind!r} are not supported")
    if not any(m["role"] != "system" for m in messages):
        raise APIError(400, "input has no message to answer.", code="invalid_input", param="input")
    return messages


def _bad_input(index: int, message: str) -> APIError:
    return APIError(
        400, f"input[{index}]: {message}", code="invalid_input", param=f"input[{index}]"
    )


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (`{type, name, description, parameters}`) in chat shape."""
    out = []
    for i, tool in enumerate(tools or []):
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"tools[{i}]: only function tools are served, got type {tool.get('type')!r}.",
                code="unsupported_tool",
                param=f"tools[{i}]",
            )
        if isinstance(tool.get("function"), dict):  # already chat-shaped: tolerate it
            out.append({"type": "function", "function": tool["function"]})
            continue
        fn: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description"):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out or None


# ---- output shapes: plain dicts in the `openai` package's shapes (tests check them) ------
def _status(done: bool) -> str:
    return "completed" if done else "in_progress"


def message_item(text: str, item_id: str, done: bool = True) -> dict[str, Any]:
    content = [text_part(text)] if done else []
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": _status(done),
        "content": content,
    }


def reasoning_item(text: str, item_id: str, done: bool = True) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if done else []
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": content,
        "status": _status(done),
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def call_item(call: ToolCall, item_id: str, done: bool = True) -> dict[str, Any]:
    arguments = call.arguments if done else ""
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": _status(done),
    }


def usage(prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


@dataclass(slots=True)
class ResponseContext:
    """What the reply's `Response` object is built from, besides its output."""

    req: ResponsesRequest
    response_id: str
    temperature: float
    top_p: float
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self, status: str, output: list[Any], tokens: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        req = self.req
        parallel = req.parallel_tool_calls
        response: dict[str, Any] = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "model": req.model,
            "status": status,
            "output": output,
            "instructions": req.instructions,
            "parallel_tool_calls": True if parallel is None else parallel,
            "tool_choice": _tool_choice(req.tool_choice),
            "tools": [_function_tool(t) for t in req.tools or []],
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "metadata": (req.model_extra or {}).get("metadata") or {},
        }
        if tokens is not None:
            response["usage"] = usage(*tokens)
        return response


def _tool_choice(choice: Any) -> Any:
    if choice is None:
        return "auto"
    if isinstance(choice, dict) and forced_tool(choice):
        return {"type": "function", "name": forced_tool(choice)}
    return choice


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
    return {"type": "function", "strict": tool.get("strict"), **fields}
