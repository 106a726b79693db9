"""Serving `POST /v1/chat/completions`: request -> choices -> response, plain or streamed.

Rendering, the engine call, stop strings and the durable record of each choice live in
serving_core.py; this module adds what is chat-specific: messages and tools in, tool
calls out (the response shapes are in chat_responses.py).

Every choice is recorded before the client sees its end: a 200 (or a streamed
`finish_reason`) means the tokens, logprobs and policy version behind it are on disk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from gateway.chat_responses import ChatShapes, ChoiceResult, ChunkWriter
from gateway.chat_template import ChatRenderer
from gateway.errors import APIError
from gateway.linking import candidate_parent_hashes, conversation_hash
from gateway.metrics import Metrics
from gateway.protocol import ChatCompletionRequest
from gateway.serving_core import (
    STREAM_END,
    Admission,
    ChoiceOutput,
    Frames,
    ServingCore,
    TextDelta,
    Tracked,
    Turn,
    choice_ids,
)
from gateway.sse import sse_response
from gateway.store.repository import SessionInfo
from gateway.tool_parsing import ContentEvent, Event, ToolCall, ToolCallEvent, ToolCallParser
from gateway.tool_prompt import forced_tool, tool_name

log = logging.getLogger(__name__)


class ChatService:
    def __init__(self, core: ServingCore, renderer: ChatRenderer, metrics: Metrics) -> None:
        self.core = core
        self.renderer = renderer
        self.metrics = metrics
        self.shapes = ChatShapes(renderer.tokenizer)

    async def create(
        self,
        req: ChatCompletionRequest,
        session: SessionInfo,
        *,
        body_hash: str | None = None,
        retry_count: int = 0,
    ) -> dict[str, Any] | StreamingResponse:
        self._check(req)
        rows = await self.core.replay_of(session.id, body_hash, retry_count, req.n)
        if rows is not None:
            return self._replay(req, rows)

        prompt_ids = self._render(req)
        params = self.core.sampling_params(
            len(prompt_ids),
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
        )
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        admission = self.core.admit(req.n)
        try:
            parent = self.core.find_parent(
                session.id, candidate_parent_hashes(req.messages, req.tools)
            )
        except BaseException:
            admission.release()
            raise
        turn = Turn(
            session_id=session.id,
            endpoint="chat.completions",
            model=req.model,
            request=req.model_dump(exclude_none=True),
            prompt_ids=prompt_ids,
            params=params,
            stops=stops,
            parent=parent,
            ids=choice_ids("chatcmpl", req.n),
            request_hash=body_hash,
        )
        tracked = self.core.track(session.id, body_hash)
        if req.stream:
            return await self._stream(req, turn, admission, tracked)
        with admission, tracked:
            if req.n == 1:
                results = [await self._complete(req, turn, 0)]
            else:  # concurrently, so that the engine batches them
                results = await asyncio.gather(
                    *(self._complete(req, turn, i) for i in range(req.n)), return_exceptions=True
                )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return self.shapes.completion(req, turn.ids[0], len(prompt_ids), results)  # type: ignore[arg-type]

    # ---- request checks and rendering ------------------------------------------------
    def _check(self, req: ChatCompletionRequest) -> None:
        """422 for well-formed requests that cannot be served."""
        if req.n > self.core.max_n:
            raise APIError(
                422,
                f"n={req.n} is more than this gateway serves in one request ({self.core.max_n}).",
                code="n_too_large",
                param="n",
                retryable=False,
            )
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
        names = {tool_name(t) for t in req.tools or []}
        if not req.tools:
            raise APIError(
                422,
                "tool_choice needs `tools` to choose from.",
                code="tool_choice_without_tools",
                param="tool_choice",
                retryable=False,
            )
        forced = forced_tool(choice)
        if forced is not None and forced not in names:
            raise APIError(
                422,
                f"tool_choice names the function {forced!r}, which is not in `tools`.",
                code="unknown_tool",
                param="tool_choice",
                retryable=False,
            )

    def _render(self, req: ChatCompletionRequest) -> list[int]:
        tools = None if req.tool_choice == "none" else req.tools
        return self.core.render(
            req.messages, tools, req.tool_choice, param="messages", code="invalid_messages"
        )

    @staticmethod
    def _parser(req: ChatCompletionRequest) -> ToolCallParser | None:
        return ToolCallParser() if req.tools and req.tool_choice != "none" else None

    # ---- one choice ------------------------------------------------------------------
    async def _complete(self, req: ChatCompletionRequest, turn: Turn, index: int) -> ChoiceResult:
        out: ChoiceOutput | None = None
        async for item in self.core.generate(turn, index):
            if isinstance(item, ChoiceOutput):
                out = item
        assert out is not None
        parser = self._parser(req)
        if parser is not None:
            parser.feed(out.text)
            parser.finish()
        message, finish = self._finish_choice(req, turn, out, parser)
        await self._record(req, turn, out, message, finish)
        return out, message, finish

    def _finish_choice(
        self,
        req: ChatCompletionRequest,
        turn: Turn,
        out: ChoiceOutput,
        parser: ToolCallParser | None,
    ) -> tuple[dict[str, Any], str]:
        """The assistant message (as recorded and answered) and the finish reason."""
        if parser is None:
            return {"role": "assistant", "content": out.text}, out.finish_reason
        self.core.count_tool_calls(parser)
        message: dict[str, Any] = {"role": "assistant", "content": parser.content}
        if not parser.tool_calls:
            return message, out.finish_reason
        message["tool_calls"] = [tc.to_openai() for tc in parser.tool_calls]
        finish = "tool_calls" if out.finish_reason == "stop" else out.finish_reason
        return message, finish

    async def _record(
        self,
        req: ChatCompletionRequest,
        turn: Turn,
        out: ChoiceOutput,
        message: dict[str, Any],
        finish: str,
    ) -> None:
        answer_hash = conversation_hash([*req.messages, message], req.tools)
        await self.core.record(turn, out, {"message": message}, finish, answer_hash)

    def _replay(self, req: ChatCompletionRequest, rows: list[dict[str, Any]]) -> Any:
        """Answer a client retry from the original's records: no second sample."""
        results: list[ChoiceResult] = [
            (
                ChoiceOutput(
                    index=r["choice_index"],
                    completion_id=r["id"],
                    text=r["response"]["message"].get("content") or "",
                    output_ids=r["output_ids"],
                    logprobs=r["output_logprobs"],
                    versions=r["output_versions"],
                    top_logprobs=None,
                    finish_reason=r["finish_reason"],
                ),
                r["response"]["message"],
                r["finish_reason"],
            )
            for r in rows
        ]
        if not req.stream:
            return self.shapes.completion(req, rows[0]["id"], rows[0]["prompt_tokens"], results)
        frames = ChunkWriter(req, rows[0]["id"], self.shapes)
        body: list[bytes] = []
        for out, message, finish in results:
            events: list[Event] = []
            if message.get("content"):
                events.append(ContentEvent(message["content"]))
            for i, tc in enumerate(message.get("tool_calls") or []):
                fn = tc["function"]
                call = ToolCall(tc["id"], fn["name"], fn["arguments"])
                events.append(ToolCallEvent(i, call))
            delta = TextDelta("", out.output_ids, out.logprobs, None)
            body += frames.events(out.index, events, delta)
            body.append(frames.finish(out.index, finish))
        body += frames.closing(
            rows[0]["prompt_tokens"], sum(len(o.output_ids) for o, _, _ in results)
        )

        async def replay() -> AsyncIterator[bytes]:
            for frame in body:
                yield frame

        return sse_response(replay())

    # ---- streamed answer -------------------------------------------------------------
    async def _stream(
        self, req: ChatCompletionRequest, turn: Turn, admission: Admission, tracked: Tracked
    ) -> StreamingResponse:
        """Generate in a task of its own, so that the records are made even if the client
        leaves; the response only relays what that task queues.

        Errors before the first token (a dead engine, say) still get their HTTP status.
        """
        return await self.core.stream_response(
            lambda queue, cancel: self._produce(req, turn, queue, cancel, admission, tracked)
        )

    async def _produce(
        self,
        req: ChatCompletionRequest,
        turn: Turn,
        queue: Frames,
        cancel: asyncio.Event,
        admission: Admission,
        tracked: Tracked,
    ) -> None:
        frames = ChunkWriter(req, turn.ids[0], self.shapes)
        try:
            results = await asyncio.gather(
                *(self._stream_choice(req, turn, i, frames, queue, cancel) for i in range(req.n)),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                queue.put_nowait(_api_error(errors[0]))
                return
            completion_tokens = sum(len(r.output_ids) for r in results)  # type: ignore[union-attr]
            for frame in frames.closing(len(turn.prompt_ids), completion_tokens):
                queue.put_nowait(frame)
        except BaseException as exc:
            queue.put_nowait(_api_error(exc))
            raise
        finally:
            queue.put_nowait(STREAM_END)
            admission.release()
            tracked.done()

    async def _stream_choice(
        self,
        req: ChatCompletionRequest,
        turn: Turn,
        index: int,
        frames: ChunkWriter,
        queue: Frames,
        cancel: asyncio.Event,
    ) -> ChoiceOutput:
        parser = self._parser(req)
        out: ChoiceOutput | None = None
        try:
            async for item in self.core.generate(turn, index, stream=True, cancel=cancel):
                if isinstance(item, ChoiceOutput):
                    out = item
                    break
                events: list[Event]
                if parser is not None:
                    events = parser.feed(item.text)
                else:
                    events = [ContentEvent(item.text)] if item.text else []
                for frame in frames.events(index, events, item):
                    queue.put_nowait(frame)
        except BaseException:
            cancel.set()  # the other choices stop too
            raise
        assert out is not None
        if parser is not None:
            for frame in frames.events(index, parser.finish(), None):
                queue.put_nowait(frame)
        message, finish = self._finish_choice(req, turn, out, parser)
        await self._record(req, turn, out, message, finish)
        if out.finish_reason != "abort":
            queue.put_nowait(frames.finish(index, finish))
        return out


def _api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, asyncio.CancelledError):
        return APIError(503, "the request was cancelled", code="cancelled")
    log.error("streamed chat completion failed", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
