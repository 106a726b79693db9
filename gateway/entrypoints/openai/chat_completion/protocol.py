"""`POST /v1/chat/completions` shapes: the request body, `ChatCompletion` and chunks.

Answers are built with the `openai`
package's own types (`model_construct`: no validation cost).
"""

from __future__ import annotations

import time
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import chat_completion as cc
from openai.types.chat import chat_completion_chunk as chunk_types
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from openai.types.chat.chat_completion_token_logprob import (
    ChatCompletionTokenLogprob,
    TopLogprob,
)
from openai.types.completion_usage import CompletionUsage
from pydantic import Field, field_validator

from gateway.chat.tool_parsers import ContentEvent, Event, ReasoningEvent
from gateway.entrypoints.openai.protocol import ChoicesRequest
from gateway.inference.base import TopLogprobs
from gateway.serving.endpoint import Answer
from gateway.serving.turn import TextDelta
from gateway.sse import SSE_DONE


class ChatCompletionRequest(ChoicesRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
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
            if role not in ("system", "developer", "user", "assistant", "tool", "function"):
                raise ValueError(
                    f"messages[{i}].role must be system/user/assistant/tool, got {role!r}"
                )
        return messages

    def may_call_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class ChatShapes:
    """Response builders; holds the tokenizer for the token strings of logprobs."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._token_text: dict[int, str] = {}

    def logprobs(
        self, ids: list[int], logprobs: list[float], top: list[TopLogprobs] | None
    ) -> list[ChatCompletionTokenLogprob]:
        out = []
        for k, (tid, lp) in enumerate(zip(ids, logprobs, strict=False)):
            piece = self._token(tid)
            alternatives = []
            if top is not None and k < len(top):
                alternatives = [
                    TopLogprob.model_construct(
                        token=(alt := self._token(a)), logprob=alp, bytes=list(alt.encode())
                    )
                    for a, alp in top[k]
                ]
            out.append(
                ChatCompletionTokenLogprob.model_construct(
                    token=piece, logprob=lp, bytes=list(piece.encode()), top_logprobs=alternatives
                )
            )
        return out

    def _token(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id])
            if len(self._token_text) < 200_000:
                self._token_text[token_id] = text
        return text

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
            out, message, finish = a.out, a.message or {}, a.finish_reason
            completion_tokens += len(out.output_ids)
            logprobs = None
            if req.logprobs:
                logprobs = cc.ChoiceLogprobs.model_construct(
                    content=self.logprobs(out.output_ids, out.logprobs, out.top_logprobs)
                )
            choices.append(
                cc.Choice.model_construct(
                    index=out.index,
                    finish_reason=finish,
                    logprobs=logprobs,
                    message=message_model(message),
                )
            )
        completion = ChatCompletion.model_construct(
            id=response_id,
            object="chat.completion",
            created=int(time.time()),
            model=req.model,
            choices=choices,
            usage=usage(prompt_tokens, completion_tokens),
        )
        return completion.model_dump(mode="json", exclude_unset=True)


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
                d = chunk_types.ChoiceDelta.model_construct(content=event.text)
                frames.append(self._frame(index, d))
            elif isinstance(event, ReasoningEvent):  # vLLM's and DeepSeek's field name
                d = chunk_types.ChoiceDelta.model_construct(reasoning_content=event.text)
                frames.append(self._frame(index, d))
            else:
                call = event.call
                head = chunk_types.ChoiceDeltaToolCall.model_construct(
                    index=event.index,
                    id=call.id,
                    type="function",
                    function=chunk_types.ChoiceDeltaToolCallFunction.model_construct(
                        name=call.name, arguments=""
                    ),
                )
                args = chunk_types.ChoiceDeltaToolCall.model_construct(
                    index=event.index,
                    function=chunk_types.ChoiceDeltaToolCallFunction.model_construct(
                        arguments=call.arguments
                    ),
                )
                for tc in (head, args):
                    d = chunk_types.ChoiceDelta.model_construct(tool_calls=[tc])
                    frames.append(self._frame(index, d))
        return frames

    def finish(self, index: int, finish_reason: str) -> bytes:
        return self._frame(index, chunk_types.ChoiceDelta.model_construct(), finish_reason)

    def closing(self, prompt_tokens: int, completion_tokens: int) -> list[bytes]:
        frames = []
        if self.include_usage:
            chunk = ChatCompletionChunk.model_construct(
                id=self.id,
                object="chat.completion.chunk",
                created=self.created,
                model=self.req.model,
                choices=[],
                usage=usage(prompt_tokens, completion_tokens),
            )
            frames.append(_sse(chunk))
        frames.append(SSE_DONE)
        return frames

    def _hold(self, index: int, delta: TextDelta) -> None:
        held = self._pending.get(index)
        if held is None:
            self._pending[index] = TextDelta(
                "",
                list(delta.token_ids),
                list(delta.logprobs),
                None if delta.top_logprobs is None else list(delta.top_logprobs),
            )
            return
        held.token_ids += delta.token_ids
        held.logprobs += delta.logprobs
        if held.top_logprobs is not None and delta.top_logprobs is not None:
            held.top_logprobs += delta.top_logprobs

    def _frame(
        self, index: int, delta: chunk_types.ChoiceDelta, finish_reason: str | None = None
    ) -> bytes:
        if index not in self._announced:  # the first chunk of a choice names the role
            self._announced.add(index)
            delta.role = "assistant"
            if delta.content is None and not delta.tool_calls:
                delta.content = ""
        fields: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish_reason}
        held = self._pending.pop(index, None)
        if self.req.logprobs:
            fields["logprobs"] = None
            if held is not None:
                content = self.shapes.logprobs(held.token_ids, held.logprobs, held.top_logprobs)
                fields["logprobs"] = chunk_types.ChoiceLogprobs.model_construct(content=content)
        chunk = ChatCompletionChunk.model_construct(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.req.model,
            choices=[chunk_types.Choice.model_construct(**fields)],
        )
        if self.include_usage:
            chunk.usage = None
        return _sse(chunk)


def _sse(chunk: ChatCompletionChunk) -> bytes:
    return b"data: " + chunk.model_dump_json(exclude_unset=True).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    return CompletionUsage.model_construct(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def message_model(message: dict[str, Any]) -> ChatCompletionMessage:
    fields: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content") is not None:
        fields["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        fields["tool_calls"] = [
            ChatCompletionMessageFunctionToolCall.model_construct(
                id=tc["id"],
                type="function",
                function=Function.model_construct(
                    name=tc["function"]["name"], arguments=tc["function"]["arguments"]
                ),
            )
            for tc in message["tool_calls"]
        ]
    return ChatCompletionMessage.model_construct(**fields)
