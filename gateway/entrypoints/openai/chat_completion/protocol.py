"""`POST /v1/chat/completions` shapes: the request body, `ChatCompletion` and chunks."""

from __future__ import annotations

import functools
import time
from typing import Any

from pydantic import Field, field_validator

from gateway.chat.events import ContentEvent, Event, ReasoningEvent
from gateway.entrypoints.openai.protocol import ChoicesRequest, usage
from gateway.inference.base import TopLogprobs
from gateway.serving.turn import Answer, TextDelta
from gateway.sse import SSE_DONE, sse_event

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# what the OpenAPI document says a message is (checked by the validator below and by
# the template; the model keeps plain dicts, which is all the template needs)
_MESSAGE_SCHEMA = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"enum": list(_ROLES)},
        "content": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object"}},
                {"type": "null"},
            ]
        },
    },
}


class ChatCompletionRequest(ChoicesRequest):
    messages: list[dict[str, Any]] = Field(
        min_length=1, json_schema_extra={"items": _MESSAGE_SCHEMA}
    )
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("messages")
    @classmethod
    def _messages_have_roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in _ROLES:
                raise ValueError(
                    f"messages[{i}].role must be system/user/assistant/tool, got {role!r}"
                )
        return messages


class ChatShapes:
    """Response builders; holds the tokenizer for the token strings of logprobs.

    Answers are plain dicts in the shapes of the `openai` package's `ChatCompletion` and
    `ChatCompletionChunk` (tests check them against those types): building pydantic
    objects only to dump them again cost more than the rest of the reply.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        # id -> (its text, that text's UTF-8 as a list): the reply's "token" and "bytes",
        # decoded once per id (the vocabulary bounds them). The lists are shared by every
        # reply that has the token, and never changed.
        self._token = functools.cache(self._decode)

    def logprobs(
        self, ids: list[int], logprobs: list[float], top: list[TopLogprobs] | None
    ) -> list[dict[str, Any]]:
        out = []
        token = self._token
        for k, (tid, lp) in enumerate(zip(ids, logprobs, strict=False)):
            piece, raw = token(tid)
            alternatives = []
            if top is not None and k < len(top):
                for a, alp in top[k]:
                    alt, alt_raw = token(a)
                    alternatives.append({"token": alt, "logprob": alp, "bytes": alt_raw})
            out.append({"token": piece, "logprob": lp, "bytes": raw, "top_logprobs": alternatives})
        return out

    def _decode(self, token_id: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode([token_id])
        return text, list(text.encode())

    def completion(
        self,
        req: ChatCompletionRequest,
        response_id: str,
        prompt_tokens: int,
        answers: list[Answer],
    ) -> dict[str, Any]:
        choices = []
        completion_tokens = 0
        for a in answers:
            out = a.out
            completion_tokens += len(out.output_ids)
            choice: dict[str, Any] = {"finish_reason": a.finish_reason, "index": out.index}
            if req.logprobs:
                content = self.logprobs(out.output_ids, out.logprobs, out.top_logprobs)
                choice["logprobs"] = {"content": content}
            else:
                choice["logprobs"] = None
            choice["message"] = a.message  # (as the API shapes it: Choice.message)
            choices.append(choice)
        return {
            "id": response_id,
            "choices": choices,
            "created": int(time.time()),
            "model": req.model,
            "object": "chat.completion",
            "usage": usage(prompt_tokens, completion_tokens),
        }


class ChunkWriter:
    """SSE frames of one streamed chat completion (all choices)."""

    def __init__(self, req: ChatCompletionRequest, response_id: str, shapes: ChatShapes) -> None:
        self.req = req
        self.id = response_id
        self.shapes = shapes
        self.created = int(time.time())
        self.include_usage = bool((req.stream_options or {}).get("include_usage"))
        self._announced: set[int] = set()
        self._pending: dict[int, TextDelta] = {}  # tokens whose logprobs are not sent yet

    def events(self, index: int, events: list[Event], delta: TextDelta | None) -> list[bytes]:
        """Frames for parsed events; `delta` carries the tokens behind them."""
        if delta is not None and self.req.logprobs and delta.token_ids:
            self._hold(index, delta)
        frames = []
        for event in events:
            if isinstance(event, ContentEvent):
                frames.append(self._frame(index, {"content": event.text}))
            elif isinstance(event, ReasoningEvent):  # vLLM's and DeepSeek's field name
                frames.append(self._frame(index, {"reasoning_content": event.text}))
            else:
                call = event.call
                head = {
                    "index": event.index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
                args = {"index": event.index, "function": {"arguments": call.arguments}}
                for tc in (head, args):
                    frames.append(self._frame(index, {"tool_calls": [tc]}))
        return frames

    def finish(self, index: int, finish_reason: str) -> bytes:
        return self._frame(index, {}, finish_reason)

    def closing(self, prompt_tokens: int, completion_tokens: int) -> list[bytes]:
        if not self.include_usage:
            return [SSE_DONE]
        return [self._chunk([], usage(prompt_tokens, completion_tokens)), SSE_DONE]

    def _hold(self, index: int, delta: TextDelta) -> None:
        top = None if delta.top_logprobs is None else []
        held = self._pending.setdefault(index, TextDelta("", [], [], top))
        held.token_ids += delta.token_ids
        held.logprobs += delta.logprobs
        if held.top_logprobs is not None and delta.top_logprobs is not None:
            held.top_logprobs += delta.top_logprobs

    def _frame(self, index: int, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        if index not in self._announced:  # the first chunk of a choice names the role
            self._announced.add(index)
            delta = {"role": "assistant", **delta}
            if delta.get("content") is None and not delta.get("tool_calls"):
                delta["content"] = ""
        choice: dict[str, Any] = {"delta": delta, "finish_reason": finish_reason, "index": index}
        held = self._pending.pop(index, None)
        if self.req.logprobs:
            choice["logprobs"] = None
            if held is not None:
                content = self.shapes.logprobs(held.token_ids, held.logprobs, held.top_logprobs)
                choice["logprobs"] = {"content": content}
        return self._chunk([choice], None)

    def _chunk(self, choices: list[dict[str, Any]], tokens: dict[str, int] | None) -> bytes:
        """A `chat.completion.chunk`; with `include_usage`, each carries a `usage` (null but
        on the last)."""
        chunk: dict[str, Any] = {
            "id": self.id,
            "choices": choices,
            "created": self.created,
            "model": self.req.model,
            "object": "chat.completion.chunk",
        }
        if self.include_usage:
            chunk["usage"] = tokens
        return sse_event(chunk)
