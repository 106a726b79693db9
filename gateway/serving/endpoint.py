"""One template method for every generating endpoint: `OpenAIServing.handle_request`.

Validate, answer a client retry from the original's record, convert the request into
turns (prompt ids, sampling params, parent), run each choice through the engine,
record it, then shape the reply as a stream or whole. An endpoint (chat completions,
completions, responses, ...) fills in only its own steps: `validate`, `prepare`,
`new_choice` (parsing and per-delta frames), `response`, `replay`, and the frames
that open and close its stream.

Every choice is recorded before its client sees its end: a 200 (or a streamed finish)
means the tokens, logprobs and policy version behind it are on disk.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fastapi.responses import StreamingResponse

from gateway.chat.events import Event, content_events
from gateway.chat.linking import ConversationHash
from gateway.chat.output_parser import OutputParser
from gateway.chat.template import Rendered
from gateway.errors import APIError, as_api_error
from gateway.serving.core import Admission, ServingCore, Tracked
from gateway.serving.turn import ChoiceOutput, Parent, TextDelta, Turn
from gateway.sse import sse_error, sse_response
from gateway.store.delta import continued_length
from gateway.store.repository import SessionInfo

Req = TypeVar("Req")

# What a stream's producer task queues: SSE frames, an error, or None (the end).
Frames = asyncio.Queue[bytes | APIError | None]
STREAM_END = None


@dataclass(frozen=True)
class RetryIdentity:
    """What tells a client's retry from a new request: the body bytes and its count."""

    body_hash: str | None = None
    retry_count: int = 0


@dataclass(slots=True)
class Prepared(Generic[Req]):
    """A request converted for the engine: its turns, `per_turn` choices each."""

    req: Req
    turns: list[Turn]
    per_turn: int = 1
    stream: bool = False
    context: dict[str, Any] = field(default_factory=dict)  # the endpoint's own


@dataclass(slots=True)
class Answer:
    """A finished choice: what is recorded, and what the reply shapes are built from."""

    out: ChoiceOutput
    finish_reason: str
    response: dict[str, Any]  # the `response` column
    answer_hash: str  # what a later turn continuing this answer is found by
    message: dict[str, Any] | None = None  # the assistant message, where there is one


class Choice:
    """One choice being generated: parses its text and, when streaming, makes frames.

    The base parses tool calls when given a parser and makes no frames; endpoints
    subclass it for their stream shapes.
    """

    def __init__(self, index: int, parser: OutputParser | None, streaming: bool) -> None:
        self.index = index
        self.parser = parser
        self.streaming = streaming

    def on_delta(self, delta: TextDelta) -> list[bytes]:
        events = self.parser.feed(delta.text) if self.parser else content_events(delta.text)
        return self.frames(events, delta) if self.streaming else []

    def on_end(self) -> list[bytes]:
        events = self.parser.finish() if self.parser else []
        return self.frames(events, None) if self.streaming else []

    def frames(self, events: list[Event], delta: TextDelta | None) -> list[bytes]:
        return []

    def done(self, answer: Answer) -> list[bytes]:
        """Frames once the choice is recorded (not sent when its client has left)."""
        return []


class OpenAIServing(abc.ABC, Generic[Req]):
    endpoint: str  # the `endpoint` column of the records

    def __init__(self, core: ServingCore) -> None:
        self.core = core

    # ---- the template ----------------------------------------------------------------
    async def handle_request(
        self, req: Req, session: SessionInfo, retry: RetryIdentity | None = None
    ) -> dict[str, Any] | StreamingResponse:
        retry = retry or RetryIdentity()
        self.validate(req)
        n = self.num_choices(req)
        rows = await self.core.replay_of(session.id, retry.body_hash, retry.retry_count, n)
        if rows is not None:
            return self.replay(req, rows)
        p = await self.prepare(req, session, retry.body_hash)
        if session.sampling:
            for turn in p.turns:
                self.core.force_sampling(turn, session.sampling)
        admission = self.core.admit(session, p.turns, p.per_turn)
        tracked = self.core.track(session.id, retry.body_hash)
        try:
            await tracked.publish()
        except BaseException:  # (the store is down: a 503)
            admission.release()
            tracked.done()
            raise
        if p.stream:
            return await self._stream(p, admission, tracked)
        with admission, tracked:
            answers = await self._run_all(p)
        return self.response(p, answers)

    def turn(
        self,
        req: Any,
        session: SessionInfo,
        prompt_ids: list[int],
        ids: list[str],
        body_hash: str | None,
        *,
        max_tokens: int | None,
        top_logprobs: int = 0,
        stops: list[str] | None = None,
        parent: Parent | None = None,
        request: dict[str, Any] | None = None,
        param: str = "messages",
        prompt_text: str | None = None,
        prompt: Rendered | None = None,
        history: str = "template",
        conversation: ConversationHash | None = None,
    ) -> Turn:
        """One request as the engine and the store see it: the step `prepare` ends with.

        `prompt` (the rendered chat prompt) gives the prompt ids and text; `history`:
        the session's mode, recorded per turn when it is token_exact."""
        if prompt is not None:
            prompt_ids, prompt_text = prompt.ids, prompt.text
        params = self.core.sampling_params(
            len(prompt_ids),
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            top_logprobs=top_logprobs,
            param=param,
        )
        request = request if request is not None else req.model_dump(exclude_none=True)
        if parent is None:
            continues = None
        elif prompt is not None and prompt.continues:  # built on the parent's ids
            continues = True
        else:
            # does it start with exactly the tokens the parent saw and produced?
            shared = continued_length(parent.prompt_ids, parent.output_ids, prompt_ids)
            continues = shared == len(parent.prompt_ids) + len(parent.output_ids)
        return Turn(
            session.id,
            self.endpoint,
            req.model,
            request,
            prompt_ids,
            params,
            stops or [],
            parent,
            ids,
            body_hash,
            prompt_text=prompt_text,
            rendered=prompt,
            conversation=conversation,
            continues_parent=continues,
            drift=self.core.drift(parent, prompt_ids) if continues is False else None,
            history=prompt.history if prompt is not None and history != "template" else None,
            history_fallback=prompt.fallback if prompt is not None else None,
        )

    # ---- what each endpoint fills in -------------------------------------------------
    def validate(self, req: Req) -> None:  # noqa: B027 - optional step
        """Errors for well-formed requests that cannot be served (before any work)."""

    @abc.abstractmethod
    def num_choices(self, req: Req) -> int: ...

    @abc.abstractmethod
    async def prepare(self, req: Req, session: SessionInfo, body_hash: str | None) -> Prepared:
        """Render the prompt(s), pick sampling params, find the parent turn."""

    @abc.abstractmethod
    def new_choice(self, p: Prepared, turn: Turn, index: int) -> Choice: ...

    @abc.abstractmethod
    def finish(self, p: Prepared, turn: Turn, choice: Choice, out: ChoiceOutput) -> Answer:
        """The generated choice as recorded and answered."""

    @abc.abstractmethod
    def response(self, p: Prepared, answers: list[Answer]) -> dict[str, Any]: ...

    @abc.abstractmethod
    def replay(self, req: Req, rows: list[dict[str, Any]]) -> Any:
        """Answer a client retry from the original's records: no second sample."""

    def stream_start(self, p: Prepared) -> list[bytes]:
        return []

    def stream_end(self, p: Prepared, answers: list[Answer]) -> list[bytes]:
        return []

    def error_frame(self, p: Prepared) -> Callable[[APIError], bytes]:
        return sse_error

    # ---- running the choices ---------------------------------------------------------
    def _jobs(self, p: Prepared) -> list[tuple[Turn, int, int]]:
        """(turn, choice index within the turn, index in the reply) of every choice."""
        return [
            (t, i, k * p.per_turn + i) for k, t in enumerate(p.turns) for i in range(p.per_turn)
        ]

    async def _run_all(self, p: Prepared) -> list[Answer]:
        jobs = self._jobs(p)
        if len(jobs) == 1:
            return [await self._run_choice(p, *jobs[0])]
        # concurrently, so that the engine batches them
        results = await asyncio.gather(
            *(self._run_choice(p, *job) for job in jobs), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    async def _run_choice(
        self,
        p: Prepared,
        turn: Turn,
        i: int,
        index: int,
        queue: Frames | None = None,
        cancel: asyncio.Event | None = None,
    ) -> Answer:
        choice = self.new_choice(p, turn, index)
        put = queue.put_nowait if queue is not None else _drop
        out: ChoiceOutput | None = None
        try:
            async for item in self.core.generate(turn, i, stream=p.stream, cancel=cancel):
                if isinstance(item, ChoiceOutput):
                    out = item
                    break
                for frame in choice.on_delta(item):
                    put(frame)
        except BaseException:
            if cancel is not None:
                cancel.set()  # the other choices stop too
            raise
        assert out is not None
        out.index = index
        for frame in choice.on_end():
            put(frame)
        answer = self.finish(p, turn, choice, out)
        self.core.count_tool_calls(choice.parser)
        failures = choice.parser.failures if choice.parser else 0
        await self.core.record(
            turn, out, answer.response, answer.finish_reason, answer.answer_hash, failures
        )
        if queue is not None and out.finish_reason != "abort":
            for frame in choice.done(answer):
                put(frame)
        return answer

    # ---- streaming -------------------------------------------------------------------
    async def _stream(
        self, p: Prepared, admission: Admission, tracked: Tracked
    ) -> StreamingResponse:
        """Generate in a task of its own, so that the records are made even if the client
        leaves; the response only relays what that task queues.

        An error before the first frame (a dead engine, say) still gets its HTTP status;
        a later one becomes an error event. Generation stops once the client is gone.
        """
        queue: Frames = asyncio.Queue()
        cancel = asyncio.Event()
        self.core.spawn(self._produce(p, queue, cancel, admission, tracked))
        first = await queue.get()
        if isinstance(first, APIError):
            raise first
        if first is STREAM_END:
            raise APIError(500, "the stream ended before it began", code="internal_error")
        error_frame = self.error_frame(p)

        async def relay() -> AsyncIterator[bytes]:
            try:
                yield first
                while True:
                    item = await queue.get()
                    if item is STREAM_END:
                        return
                    if isinstance(item, APIError):
                        yield error_frame(item)
                        return
                    yield item
            finally:
                cancel.set()  # the client is gone (or done): stop generating for it

        return sse_response(relay())

    async def _produce(
        self,
        p: Prepared,
        queue: Frames,
        cancel: asyncio.Event,
        admission: Admission,
        tracked: Tracked,
    ) -> None:
        try:
            for frame in self.stream_start(p):
                queue.put_nowait(frame)
            results = await asyncio.gather(
                *(self._run_choice(p, *job, queue, cancel) for job in self._jobs(p)),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                queue.put_nowait(as_api_error(errors[0]))
                return
            for frame in self.stream_end(p, results):  # type: ignore[arg-type]
                queue.put_nowait(frame)
        except BaseException as exc:
            queue.put_nowait(as_api_error(exc))
            raise
        finally:
            queue.put_nowait(STREAM_END)
            admission.release()
            tracked.done()


def replay_stream(frames: list[bytes]) -> StreamingResponse:
    """A finished stream, sent again (a client retry of a streamed request)."""

    async def body() -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame

    return sse_response(body())


def _drop(frame: bytes | APIError | None) -> None:
    """Frames of a choice nobody streams."""
