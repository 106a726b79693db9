"""Serving `POST /v1/responses` (the OpenAI Responses API, the Agents SDK's default).

A Responses request is turned into chat messages (`instructions` -> a system message,
`function_call` items -> assistant tool calls, `function_call_output` items -> tool
messages) and then served exactly like a chat completion: the same chat template, tool
prompt and tool-call parser, the same ServingCore generate -> record path. So a
response is recorded like a chat completion (prompt ids, output ids, logprobs,
versions, parent link) under its response id (`resp_<hex>`), and can be rewarded by it.

`previous_response_id` names an earlier response of the caller's own session: its
input and output items are put before this request's input.

Streaming emits the Responses event sequence (`response.created` ...
`response.output_text.delta` ... `response.output_item.done` ... `response.completed`);
the record is committed before `response.completed`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from openai.types.responses import (
    FunctionTool,
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
    ToolChoiceFunction,
)
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from gateway.chat_template import ChatRenderer, text_of
from gateway.errors import APIError
from gateway.linking import candidate_parent_hashes, conversation_hash
from gateway.metrics import Metrics
from gateway.protocol_responses import ResponsesRequest
from gateway.serving_core import (
    STREAM_END,
    Admission,
    ChoiceOutput,
    Frames,
    ServingCore,
    Tracked,
    Turn,
)
from gateway.sse import sse_event, sse_response
from gateway.store.repository import SessionInfo
from gateway.tool_parsing import ContentEvent, Event, ToolCall, ToolCallParser
from gateway.tool_prompt import forced_tool, tool_name

log = logging.getLogger(__name__)

ENDPOINT = "responses"
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


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
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _bad_input(i, "an input item must be an object")
        kind = item.get("type")
        if kind in (None, "message"):
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise _bad_input(i, f"role must be user/system/developer/assistant, got {role!r}")
            messages.append({"role": role, "content": text_of(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = text_of(output) if isinstance(output, list) else json.dumps(output)
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
            )
        elif kind in ("reasoning", "item_reference"):
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
                retryable=False,
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


# ---- output shapes -----------------------------------------------------------------------
def message_item(text: str, item_id: str | None = None, done: bool = True) -> ResponseOutputMessage:
    return ResponseOutputMessage.model_construct(
        id=item_id or f"msg_{uuid.uuid4().hex}",
        type="message",
        role="assistant",
        status="completed" if done else "in_progress",
        content=[text_part(text)] if done else [],
    )


def text_part(text: str) -> ResponseOutputText:
    return ResponseOutputText.model_construct(type="output_text", text=text, annotations=[])


def call_item(
    call: ToolCall, item_id: str | None = None, done: bool = True
) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall.model_construct(
        id=item_id or f"fc_{uuid.uuid4().hex}",
        type="function_call",
        call_id=call.id,
        name=call.name,
        arguments=call.arguments if done else "",
        status="completed" if done else "in_progress",
    )


def usage(prompt_tokens: int, output_tokens: int) -> ResponseUsage:
    return ResponseUsage.model_construct(
        input_tokens=prompt_tokens,
        input_tokens_details=InputTokensDetails.model_construct(
            cached_tokens=0, cache_write_tokens=0
        ),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails.model_construct(reasoning_tokens=0),
        total_tokens=prompt_tokens + output_tokens,
    )


def dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True, warnings=False)


@dataclass(slots=True)
class Answer:
    """One request being served: what the shapes and the record need."""

    req: ResponsesRequest
    turn: Turn
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # chat shape
    created_at: int

    def response(
        self, status: str, output: list[Any], tokens: tuple[int, int] | None = None
    ) -> Response:
        req = self.req
        fields: dict[str, Any] = dict(
            id=self.turn.ids[0],
            object="response",
            created_at=self.created_at,
            model=req.model,
            status=status,
            output=output,
            instructions=req.instructions,
            parallel_tool_calls=True
            if req.parallel_tool_calls is None
            else req.parallel_tool_calls,
            tool_choice=_tool_choice(req.tool_choice),
            tools=[_function_tool(t) for t in req.tools or []],
            temperature=self.turn.params.temperature,
            top_p=self.turn.params.top_p,
            max_output_tokens=req.max_output_tokens,
            previous_response_id=req.previous_response_id,
            error=None,
            incomplete_details=None,
            metadata=(req.model_extra or {}).get("metadata") or {},
        )
        if status == "incomplete":
            fields["incomplete_details"] = IncompleteDetails.model_construct(
                reason="max_output_tokens"
            )
        if tokens is not None:
            fields["usage"] = usage(*tokens)
        return Response.model_construct(**fields)


def _tool_choice(choice: Any) -> Any:
    if choice is None:
        return "auto"
    if isinstance(choice, dict) and forced_tool(choice):
        return ToolChoiceFunction.model_construct(type="function", name=forced_tool(choice))
    return choice


def _function_tool(tool: dict[str, Any]) -> FunctionTool:
    fields = {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
    return FunctionTool.model_construct(type="function", strict=tool.get("strict"), **fields)


class EventWriter:
    """The SSE frames of one streamed response, numbered by `sequence_number`.

    Output items are opened and closed as parsed events come: text opens (or continues)
    a message item, a tool call closes it and adds a complete function_call item.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.items: list[Any] = []  # finished output items
        self._msg_id: str | None = None
        self._text: list[str] = []

    @property
    def open(self) -> bool:
        """Is a message item open (text may still come)?"""
        return self._msg_id is not None

    def _frame(self, cls: Any, **fields: Any) -> bytes:
        event = cls.model_construct(sequence_number=self.seq, **fields)
        self.seq += 1
        return sse_event(dump(event), fields["type"])

    def start(self, response: Response) -> list[bytes]:
        return [
            self._frame(ResponseCreatedEvent, type="response.created", response=response),
            self._frame(ResponseInProgressEvent, type="response.in_progress", response=response),
        ]

    def events(self, events: list[Event]) -> list[bytes]:
        frames: list[bytes] = []
        for event in events:
            if isinstance(event, ContentEvent):
                frames += self.text(event.text)
            else:
                frames += self.call(event.call)
        return frames

    def text(self, text: str) -> list[bytes]:
        frames = [] if self._msg_id is not None else self._open_message()
        if text:
            self._text.append(text)
            frames.append(
                self._frame(
                    ResponseTextDeltaEvent,
                    type="response.output_text.delta",
                    item_id=self._msg_id,
                    output_index=len(self.items),
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return frames

    def _open_message(self) -> list[bytes]:
        self._msg_id = f"msg_{uuid.uuid4().hex}"
        self._text = []
        index = len(self.items)
        return [
            self._frame(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=index,
                item=message_item("", self._msg_id, done=False),
            ),
            self._frame(
                ResponseContentPartAddedEvent,
                type="response.content_part.added",
                item_id=self._msg_id,
                output_index=index,
                content_index=0,
                part=text_part(""),
            ),
        ]

    def close(self) -> list[bytes]:
        """Close the open message item, if any."""
        if self._msg_id is None:
            return []
        text, item_id, index = "".join(self._text), self._msg_id, len(self.items)
        item = message_item(text, item_id)
        frames = [
            self._frame(
                ResponseTextDoneEvent,
                type="response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._frame(
                ResponseContentPartDoneEvent,
                type="response.content_part.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=text_part(text),
            ),
            self._frame(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=index,
                item=item,
            ),
        ]
        self.items.append(item)
        self._msg_id = None
        return frames

    def call(self, call: ToolCall, item_id: str | None = None) -> list[bytes]:
        frames = self.close()
        item_id = item_id or f"fc_{uuid.uuid4().hex}"
        index = len(self.items)
        item = call_item(call, item_id)
        frames += [
            self._frame(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=index,
                item=call_item(call, item_id, done=False),
            ),
            self._frame(
                ResponseFunctionCallArgumentsDeltaEvent,
                type="response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            ),
            self._frame(
                ResponseFunctionCallArgumentsDoneEvent,
                type="response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=call.arguments,
            ),
            self._frame(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=index,
                item=item,
            ),
        ]
        self.items.append(item)
        return frames

    def finish(self, response: Response) -> bytes:
        if response.status == "incomplete":
            return self._frame(
                ResponseIncompleteEvent, type="response.incomplete", response=response
            )
        return self._frame(ResponseCompletedEvent, type="response.completed", response=response)

    def error(self, exc: APIError) -> bytes:
        return self._frame(
            ResponseErrorEvent, type="error", code=exc.code, message=exc.message, param=exc.param
        )


class ResponsesService:
    def __init__(self, core: ServingCore, renderer: ChatRenderer, metrics: Metrics) -> None:
        self.core = core
        self.renderer = renderer
        self.metrics = metrics

    async def create(
        self,
        req: ResponsesRequest,
        session: SessionInfo,
        *,
        body_hash: str | None = None,
        retry_count: int = 0,
    ) -> dict[str, Any] | StreamingResponse:
        tools = chat_tools(req.tools)
        self._check_tool_choice(req, tools)
        rows = await self.core.replay_of(session.id, body_hash, retry_count, 1)
        if rows is not None:
            return self._replay(req, rows[0])

        items = input_items(req.input)
        if req.previous_response_id is not None:
            items = await self._previous_items(session.id, req.previous_response_id) + items
        messages = to_messages(items, req.instructions)
        prompt_ids = self._render(messages, None if req.tool_choice == "none" else tools, req)
        params = self.core.sampling_params(
            len(prompt_ids),
            max_tokens=req.max_output_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            param="input",
        )
        admission = self.core.admit(1)
        try:
            parent = self.core.find_parent(session.id, candidate_parent_hashes(messages, tools))
        except BaseException:
            admission.release()
            raise
        request = req.model_dump(exclude_none=True)
        if req.previous_response_id is not None:
            request["resolved_input"] = items  # what a later previous_response_id continues
        turn = Turn(
            session_id=session.id,
            endpoint=ENDPOINT,
            model=req.model,
            request=request,
            prompt_ids=prompt_ids,
            params=params,
            stops=[],
            parent=parent,
            ids=[new_response_id()],
            request_hash=body_hash,
        )
        answer = Answer(req, turn, messages, tools, int(time.time()))
        tracked = self.core.track(session.id, body_hash)
        if req.stream:
            return await self._stream(answer, admission, tracked)
        with admission, tracked:
            out: ChoiceOutput | None = None
            async for item in self.core.generate(turn, 0):
                if isinstance(item, ChoiceOutput):
                    out = item
            assert out is not None
            parser = self._parser(answer)
            if parser is not None:
                parser.feed(out.text)
                parser.finish()
            content, calls = self._parsed(out, parser)
            output: list[Any] = []
            if content or not calls:
                output.append(message_item(content or ""))
            output += [call_item(c) for c in calls]
            _, body = await self._record(answer, out, content, calls, output)
            return body

    # ---- request checks, input and rendering -----------------------------------------
    @staticmethod
    def _check_tool_choice(req: ResponsesRequest, tools: list[dict[str, Any]] | None) -> None:
        choice = req.tool_choice
        if isinstance(choice, str) and choice not in ("auto", "none", "required"):
            raise APIError(
                400,
                f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}.",
                code="invalid_tool_choice",
                param="tool_choice",
                retryable=False,
            )
        if choice in (None, "auto", "none"):
            return
        if not tools:
            raise APIError(
                422,
                "tool_choice needs `tools` to choose from.",
                code="tool_choice_without_tools",
                param="tool_choice",
                retryable=False,
            )
        forced = forced_tool(choice)
        if forced is not None and forced not in {tool_name(t) for t in tools}:
            raise APIError(
                422,
                f"tool_choice names the function {forced!r}, which is not in `tools`.",
                code="unknown_tool",
                param="tool_choice",
                retryable=False,
            )

    async def _previous_items(self, session_id: str, response_id: str) -> list[dict[str, Any]]:
        """The input and output items of an earlier response of this same session."""
        row = await run_in_threadpool(self.core.repo.completion, session_id, response_id)
        if row is None or row["endpoint"] != ENDPOINT:
            raise APIError(
                404,
                f"No response {response_id!r} in this session.",
                code="previous_response_not_found",
                param="previous_response_id",
                retryable=False,
            )
        request, response = row["request"] or {}, row["response"] or {}
        previous = request.get("resolved_input") or input_items(request.get("input") or [])
        return [*previous, *(response.get("output") or [])]

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        req: ResponsesRequest,
    ) -> list[int]:
        return self.core.render(
            messages, tools, req.tool_choice, param="input", code="invalid_input"
        )

    @staticmethod
    def _parser(answer: Answer) -> ToolCallParser | None:
        if answer.tools and answer.req.tool_choice != "none":
            return ToolCallParser()
        return None

    def _parsed(
        self, out: ChoiceOutput, parser: ToolCallParser | None
    ) -> tuple[str | None, list[ToolCall]]:
        if parser is None:
            return out.text, []
        self.core.count_tool_calls(parser)
        return parser.content, list(parser.tool_calls)

    # ---- recording ---------------------------------------------------------------------
    async def _record(
        self,
        answer: Answer,
        out: ChoiceOutput,
        content: str | None,
        calls: list[ToolCall],
        output: list[Any],
    ) -> tuple[Response, dict[str, Any]]:
        """Commit the response (as its Responses-API body); return it and that body."""
        finish = out.finish_reason
        if calls and finish == "stop":
            finish = "tool_calls"
        status = "incomplete" if out.finish_reason == "length" else "completed"
        response = answer.response(
            status, output, (len(answer.turn.prompt_ids), len(out.output_ids))
        )
        body = dump(response)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        answer_hash = conversation_hash([*answer.messages, message], answer.tools)
        await self.core.record(answer.turn, out, body, finish, answer_hash)
        return response, body

    def _replay(self, req: ResponsesRequest, row: dict[str, Any]) -> Any:
        """Answer a client retry from the original's record: no second sample."""
        body = row["response"]
        if not req.stream:
            return body
        response = Response.model_validate(body)
        writer = EventWriter()
        frames = writer.start(
            Response.model_construct(**{**dict(response), "status": "in_progress", "output": []})
        )
        for item in response.output:
            if isinstance(item, ResponseOutputMessage):
                text = "".join(getattr(p, "text", "") for p in item.content)
                frames += writer.text(text) + writer.close()
            elif isinstance(item, ResponseFunctionToolCall):
                frames += writer.call(ToolCall(item.call_id, item.name, item.arguments), item.id)
        frames.append(writer.finish(response))

        async def replay() -> AsyncIterator[bytes]:
            for frame in frames:
                yield frame

        return sse_response(replay())

    # ---- streamed answer ---------------------------------------------------------------
    async def _stream(
        self, answer: Answer, admission: Admission, tracked: Tracked
    ) -> StreamingResponse:
        """Generate in a task of its own, so that the record is made even if the client
        leaves; the response relays what that task queues. An error before the first
        token (a dead engine) still gets its HTTP status."""
        writer = EventWriter()
        return await self.core.stream_response(
            lambda queue, cancel: self._produce(answer, writer, queue, cancel, admission, tracked),
            writer.error,
        )

    async def _produce(
        self,
        answer: Answer,
        writer: EventWriter,
        queue: Frames,
        cancel: asyncio.Event,
        admission: Admission,
        tracked: Tracked,
    ) -> None:
        started = False

        def put(frames: Callable[[], list[bytes]]) -> None:
            """Queue frames; `response.created` first, once the engine has answered."""
            nonlocal started
            if not started:
                started = True
                for frame in writer.start(answer.response("in_progress", [])):
                    queue.put_nowait(frame)
            for frame in frames():
                queue.put_nowait(frame)

        try:
            parser = self._parser(answer)
            out: ChoiceOutput | None = None
            async for item in self.core.generate(answer.turn, 0, stream=True, cancel=cancel):
                if isinstance(item, ChoiceOutput):
                    out = item
                    break
                if parser is not None:
                    events = parser.feed(item.text)
                else:
                    events = [ContentEvent(item.text)] if item.text else []
                put(lambda events=events: writer.events(events))
            assert out is not None
            if parser is not None:
                tail = parser.finish()
                put(lambda: writer.events(tail))
            content, calls = self._parsed(out, parser)
            if not writer.items and not writer.open:  # an empty answer: one empty message
                put(lambda: writer.text(""))
            put(writer.close)
            response, _ = await self._record(answer, out, content, calls, list(writer.items))
            if out.finish_reason != "abort":
                put(lambda: [writer.finish(response)])
        except BaseException as exc:
            queue.put_nowait(_api_error(exc))
            raise
        finally:
            queue.put_nowait(STREAM_END)
            admission.release()
            tracked.done()


def _api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, asyncio.CancelledError):
        return APIError(503, "the request was cancelled", code="cancelled")
    log.error("streamed response failed", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
