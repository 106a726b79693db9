"""`POST /v1/messages` shapes: the request body, its messages as chat messages (what the
chat template renders and the parent links are hashed on), and the `Message` answered.
What is honoured, refused and ignored: docs/gateway.md ("Anthropic Messages API").
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.chat.events import ToolCall
from gateway.errors import APIError
from gateway.signing import key_id

_TOOL_ID = re.compile(r"toolu_([0-9a-f]{32})_(\d+)")
# what the gateway's signature of a thinking block is for (gateway/signing.py)
THINKING = "anthropic-thinking"
# is this thinking text, with this signature, the gateway's own (for this session)?
OwnThinking = Callable[[str, str], bool]


# what the OpenAPI document says a message is (Anthropic's roles; the conversion below
# checks the rest), so that the fuzzer's valid bodies are answered, not refused
_MESSAGE_SCHEMA = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["user", "assistant"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object", "required": ["type"]}},
            ]
        },
    },
}


class CountTokensRequest(BaseModel):
    """`POST /v1/messages/count_tokens`: a Messages request without `max_tokens`."""

    model_config = ConfigDict(extra="allow")

    model: str = "default"
    messages: list[dict[str, Any]] = Field(
        min_length=1, json_schema_extra={"items": _MESSAGE_SCHEMA}
    )
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    seed: int | None = None  # not Anthropic's; honoured when a client sends one


# ---- ids and signatures ------------------------------------------------------------------
def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id(message_id: str, index: int) -> str:
    """`toolu_<the message's hex>_<i>`: names the answer a tool call came from."""
    return f"toolu_{message_id.removeprefix('msg_')}_{index}"


def message_of_tool_use(tool_id: str) -> str | None:
    """The `msg_...` id of the gateway answer a `tool_use` id came from (None: not ours)."""
    m = _TOOL_ID.fullmatch(tool_id)
    return f"msg_{m.group(1)}" if m else None


# ---- Anthropic messages -> chat messages -------------------------------------------------
def system_text(system: str | list[dict[str, Any]] | None, param: str = "system") -> str:
    """A system prompt (a string, or text blocks joined by blank lines)."""
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    texts = []
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise bad_request(f"{param}[{i}] must be a text block", f"{param}[{i}]")
        texts.append(str(block.get("text", "")))
    return "\n\n".join(texts)


def to_chat(
    req: CountTokensRequest,
    tool_arguments: Callable[[str], str | None],
    own_thinking: OwnThinking,
    start: int = 0,
    head: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The request's system prompt and messages as chat messages.

    `tool_arguments(tool_use_id)`: the arguments text the gateway generated for one of
    its own tool calls, used instead of the input the client sends back (clients
    re-serialise it), so that a later turn continues the tokens really generated.
    `head`: the chat messages of the system prompt and `req.messages[:start]`, converted
    already (a message's conversion depends only on it and on those arguments, which do
    not change once generated): only the messages from `start` on are converted.
    `own_thinking(text, signature)`: whether a thinking block is the gateway's own,
    signed for this session; any other is dropped, never rendered as the model's.
    """
    if head is not None:
        out = list(head)
    else:
        out, start = [], 0
        system = system_text(req.system)
        if system:
            out.append({"role": "system", "content": system})
    for i, message in enumerate(req.messages[start:], start):
        role = message.get("role")
        content = message.get("content")
        where = f"messages[{i}]"
        if role == "system":
            text = content if isinstance(content, str) else system_text(content, where)
            out.append({"role": "system", "content": text})
        elif role == "user":
            out += _user(content, where)
        elif role == "assistant":
            out.append(_assistant(content, where, tool_arguments, own_thinking))
        else:
            raise bad_request(
                f"{where}.role must be user, assistant or system, got {role!r}", where
            )
    if not any(m["role"] != "system" for m in out):
        raise bad_request("messages has no message to answer.", "messages")
    return out


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of blocks", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise bad_request(f"{where}.content[{j}] must be an object", f"{where}.content[{j}]")
        kind = block.get("type")
        if kind in ("image", "document"):
            raise bad_request(
                f"{where}.content[{j}]: {kind} blocks are not supported: this gateway serves "
                "a text-only model.",
                f"{where}.content[{j}]",
            )
    return content


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    """A user message: its tool results become tool messages, its text a user message
    (in the order they come)."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "".join(texts)})
            texts.clear()

    for j, block in enumerate(_blocks(content, where)):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            flush()
            text = _result_text(block.get("content"), f"{where}.content[{j}].content")
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        else:
            raise _unsupported(kind, f"{where}.content[{j}]", "user")
    flush()
    return out


def _result_text(blocks: Any, where: str) -> str:
    """A tool result's content: a string, or text blocks."""
    if not blocks or isinstance(blocks, str):
        return blocks or ""
    if not isinstance(blocks, list):
        raise bad_request(f"{where} must be a string or a list of blocks", where)
    texts = []
    for k, block in enumerate(_blocks(blocks, where)):
        if block.get("type") != "text":
            raise _unsupported(block.get("type"), f"{where}[{k}]", "tool_result")
        texts.append(str(block.get("text", "")))
    return "".join(texts)


def _assistant(
    content: Any,
    where: str,
    tool_arguments: Callable[[str], str | None],
    own_thinking: OwnThinking,
) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(_blocks(content, where)):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            tid = str(block.get("id", ""))
            arguments = tool_arguments(tid)
            if arguments is None:
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(ToolCall(tid, block.get("name"), arguments).to_openai())
        elif kind == "thinking":
            text, signature = block.get("thinking"), block.get("signature")
            # another model's (or a client's) thinking is not this one's
            if isinstance(text, str) and isinstance(signature, str):
                if own_thinking(text, signature):
                    reasoning.append(text)
        elif kind == "redacted_thinking":
            continue
        else:
            raise _unsupported(kind, f"{where}.content[{j}]", "assistant")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _unsupported(kind: Any, where: str, role: str) -> APIError:
    return bad_request(
        f"{where}: content blocks of type {kind!r} are not supported in {role} messages", where
    )


def sent_back(req: CountTokensRequest, start: int = 0) -> tuple[list[str], list[str]]:
    """The ids of the assistant `tool_use` blocks in `req.messages[start:]`, and the key
    ids the signatures of its `thinking` blocks claim."""
    blocks = [
        b
        for m in req.messages[start:]
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict)
    ]
    tool_ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
    sigs = (b.get("signature") for b in blocks if b.get("type") == "thinking")
    return tool_ids, [k for k in (key_id(s) for s in sigs if isinstance(s, str)) if k is not None]


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic tools (`{name, description, input_schema}`) in chat shape."""
    out = []
    for i, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind not in (None, "custom") or "input_schema" not in tool:
            raise bad_request(
                f"tools[{i}]: only client tools with an `input_schema` are served, "
                f"got type {kind!r}.",
                f"tools[{i}]",
            )
        fn: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description"):
            fn["description"] = tool["description"]
        fn["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": fn})
    return out or None


_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def chat_tool_choice(choice: dict[str, Any] | None) -> Any:
    """`{"type": auto | any | tool | none}` as chat's `tool_choice`."""
    if choice is None:
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind in _TOOL_CHOICES:
        return _TOOL_CHOICES[kind]
    raise bad_request(
        f"tool_choice.type must be auto, any, tool or none, got {kind!r}", "tool_choice"
    )


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, code="invalid_request", param=param)


# ---- answers -----------------------------------------------------------------------------
def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    stop_sequence: str | None,
    tokens: dict[str, int],  # its `usage`
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": tokens,
    }


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    try:
        parsed = json.loads(call.arguments or "{}")
    except ValueError:
        parsed = {}
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": parsed if isinstance(parsed, dict) else {},
    }


def stop_reason(finish_reason: str, called: bool, stop_string: str | None) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    if stop_string is not None:
        return "stop_sequence"
    return "end_turn"
