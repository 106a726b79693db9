"""One template method for every generating endpoint: `ServingEndpoint.handle_request`.

A request goes through three stages, each calling only forward: prompt
(serving/prompt.py), generate (serving/generate.py) and record (serving/record.py); it
is admitted (serving/quotas.py) between the first two. An endpoint fills in only its
own steps, the methods below its template.

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

from gateway.chat.events import ContentEvent, Event, ReasoningEvent, ToolCall, content_events
from gateway.chat.output_parser import OutputParser
from gateway.config import GatewayConfig
from gateway.errors import APIError, as_api_error
from gateway.serving.generate import Generator, Sampling
from gateway.serving.prompt import Prompts
from gateway.serving.quotas import Admission, Admitted
from gateway.serving.record import Records, RetryIdentity, Tracked
from gateway.serving.turn import Answer, ChoiceOutput, Prompt, TextDelta, Turn, recorded_request
from gateway.signing import Signer
from gateway.sse import sse_error, sse_response
from gateway.store.repository import SessionInfo

Req = TypeVar("Req")

# What a stream's producer task queues: SSE frames, an error, or None (the end).
Frames = asyncio.Queue[bytes | APIError | None]
STREAM_END = None


@dataclass(frozen=True, slots=True)
class Stages:
    """What every endpoint is built on, made once per gateway (gateway/state.py)."""

    prompts: Prompts
    generator: Generator
    records: Records
    admission: Admission
    signing: Signer  # the keys of the signatures the gateway hands out (thinking blocks)
    config: GatewayConfig


@dataclass(slots=True)
class Prepared(Generic[Req]):
    """A request converted for the engine: its turns, `per_turn` choices each."""

    req: Req
    turns: list[Turn]
    per_turn: int = 1
    stream: bool = False
    context: dict[str, Any] = field(default_factory=dict)  # the endpoint's own
    choice: Choice | None = None  # a one-choice endpoint's, made with its turn


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

    def message(self, out: ChoiceOutput) -> dict[str, Any]:
        """The assistant message the answer parses to (what a later turn repeats)."""
        parser = self.parser
        if parser is None:
            return {"role": "assistant", "content": out.text}
        message: dict[str, Any] = {"role": "assistant", "content": parser.content}
        if parser.reasoning is not None:
            message["reasoning_content"] = parser.reasoning
        if parser.tool_calls:
            message["tool_calls"] = [c.to_openai() for c in parser.tool_calls]
        return message

    def done(self, answer: Answer) -> list[bytes]:
        """Frames once the choice is recorded (not sent when its client has left)."""
        return []


class BlockChoice(Choice, abc.ABC):
    """The one choice of an endpoint whose answer is a list of blocks (Messages' content
    blocks, Responses' output items): one open text or reasoning block at a time, a tool
    call a block of its own. Blocks are made even when not streamed (`emit=False`: no
    frames), as the recorded answer is built from them.

    The stream opens (`start_frames`) once the engine has answered: an engine that is
    down before then is an HTTP error the client retries, not a broken stream."""

    REASONING = "reasoning"  # the kind of a reasoning block, as the API names it

    def __init__(self, parser: OutputParser | None, emit: bool) -> None:
        super().__init__(0, parser, True)
        self.emit = emit
        self.blocks: list[Any] = []  # the finished blocks
        self.kind: str | None = None  # the open block's: text or REASONING
        self.parts: list[str] = []  # the open block's text so far
        self._started = False

    def frames(self, events: list[Event], delta: TextDelta | None) -> list[bytes]:
        frames = self.started() if events else []
        for event in events:
            if isinstance(event, ContentEvent):
                frames += self.write("text", event.text)
            elif isinstance(event, ReasoningEvent):
                frames += self.write(self.REASONING, event.text)
            else:
                frames += self.close() + self.tool_call(event.call)
        return frames

    def on_end(self) -> list[bytes]:
        frames = self.started() + super().on_end()
        if not self.blocks and self.kind is None:
            frames += self.empty()
        return frames + self.close()

    def started(self) -> list[bytes]:
        """The opening frames, the first time only."""
        if self._started:
            return []
        self._started = True
        return self.start_frames()

    def write(self, kind: str, text: str) -> list[bytes]:
        """Text into the open block of `kind`, opened first (closing another) if need be."""
        frames: list[bytes] = []
        if self.kind != kind:
            frames = self.close()
            self.kind, self.parts = kind, []
            frames += self.opened(kind)
        if text:
            self.parts.append(text)
            frames += self.delta(kind, text)
        return frames

    def close(self) -> list[bytes]:
        """Close the open block, if any: it joins `blocks`."""
        if self.kind is None:
            return []
        block, frames = self.closed(self.kind, "".join(self.parts))
        self.blocks.append(block)
        self.kind = None
        return frames

    # ---- what each API states: its frames, and its blocks ----------------------------
    def start_frames(self) -> list[bytes]:
        return []

    def empty(self) -> list[bytes]:
        """What an answer with no block at all holds (nothing, unless the API says)."""
        return []

    @abc.abstractmethod
    def opened(self, kind: str) -> list[bytes]: ...

    @abc.abstractmethod
    def delta(self, kind: str, text: str) -> list[bytes]: ...

    @abc.abstractmethod
    def closed(self, kind: str, text: str) -> tuple[Any, list[bytes]]:
        """The finished block of `kind` (at index `len(self.blocks)`) and its frames."""

    @abc.abstractmethod
    def tool_call(self, call: ToolCall) -> list[bytes]:
        """A complete tool call: its block appended, its frames."""


class ServingEndpoint(abc.ABC, Generic[Req]):
    endpoint: str  # the `endpoint` column of the records
    # the request field holding the conversation: recorded as the request's own object
    # (not a copy), and named by errors about the prompt; None: the request is dumped
    history_field: str | None = None

    def __init__(self, stages: Stages) -> None:
        self.prompts, self.generator = stages.prompts, stages.generator
        self.records, self.admission = stages.records, stages.admission
        self.config = stages.config

    # ---- the template ----------------------------------------------------------------
    async def handle_request(
        self, req: Req, session: SessionInfo, retry: RetryIdentity | None = None
    ) -> dict[str, Any] | StreamingResponse:
        retry = retry or RetryIdentity()
        n = self.num_choices(req)
        if n > self.config.max_n:
            raise APIError(
                422,
                f"{n} choices (prompts x n) is more than this gateway serves in one request "
                f"({self.config.max_n}).",
                code="n_too_large",
                param="n",
            )
        self.validate(req)
        rows = await self.records.replay_of(session.id, retry, n)
        if rows is not None:
            return self.replay(req, rows)
        p = await self.prepare(req, session)
        for turn in p.turns:
            turn.request_hash = retry.body_hash
            if session.sampling:
                turn.force_sampling(session.sampling)
        admitted = self.admission.admit(session, p.turns, p.per_turn)
        tracked = Tracked(self.records, session.id, retry.body_hash)
        held = True  # released here, unless a stream's producer takes them over
        try:
            await tracked.publish()  # (the store is down: a 503)
            if p.stream:
                held = False
                return await self._stream(p, admitted, tracked)
            answers = await self._run_all(p)
        finally:
            if held:
                admitted.release()
                tracked.done()
        return self.response(p, answers)

    def turn(
        self, req: Any, session: SessionInfo, prompt: Prompt, ids: list[str], sampling: Sampling
    ) -> Turn:
        """One request as the engine and the store see it (`ids`: one completion id per
        choice): the step `prepare` ends with."""
        params = self.generator.params(len(prompt.ids), req, sampling, prompt.param)
        request = recorded_request(req, self.history_field)
        return Turn(
            session.id, self.endpoint, req.model, request, prompt, params, sampling.stops or [], ids
        )

    # ---- what each endpoint fills in -------------------------------------------------
    def validate(self, req: Req) -> None:  # noqa: B027 - optional step
        """Errors for well-formed requests that cannot be served (before any work)."""

    def num_choices(self, req: Req) -> int:
        return 1

    @abc.abstractmethod
    async def prepare(self, req: Req, session: SessionInfo) -> Prepared:
        """The request's turns: prompt(s) from stage 1 (`self.prompts`), then `turn`."""

    def new_choice(self, p: Prepared, turn: Turn, index: int) -> Choice:
        """Choice `index` of `turn` (by default, the one `prepare` made)."""
        assert p.choice is not None
        return p.choice

    @abc.abstractmethod
    def finish(self, p: Prepared, turn: Turn, choice: Choice, out: ChoiceOutput) -> Answer:
        """The generated choice as recorded and answered."""

    @abc.abstractmethod
    def response(self, p: Prepared, answers: list[Answer]) -> dict[str, Any]: ...

    def replay(self, req: Req, rows: list[dict[str, Any]]) -> Any:
        """Answer a client retry from the original's records: no second sample. The
        endpoint states only the shapes: its body, or its stream's frames."""
        if not req.stream:  # type: ignore[attr-defined]
            return self.replay_body(req, rows)
        return sse_response(self.replay_frames(req, rows))

    def replay_body(self, req: Req, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The whole answer again: a one-choice endpoint recorded the body it answered."""
        return rows[0]["response"]

    @abc.abstractmethod
    def replay_frames(self, req: Req, rows: list[dict[str, Any]]) -> list[bytes]:
        """The streamed answer again, from its records."""

    def forget(self, session_id: str) -> None:  # noqa: B027 - optional step
        """Drop what the endpoint keeps of a session that has ended."""

    def stream_start(self, p: Prepared) -> list[bytes]:
        return []

    def stream_end(self, p: Prepared, answers: list[Answer]) -> list[bytes]:
        return []

    def error_frame(self, p: Prepared) -> Callable[[APIError], bytes]:
        return sse_error

    # ---- running the choices ---------------------------------------------------------
    async def _run_all(
        self, p: Prepared, queue: Frames | None = None, cancel: asyncio.Event | None = None
    ) -> list[Answer]:
        """Every choice (choice `i` of turn `k` is answer `k * per_turn + i`); the first
        error once all have ended."""
        jobs = [
            (t, i, k * p.per_turn + i) for k, t in enumerate(p.turns) for i in range(p.per_turn)
        ]
        if len(jobs) == 1:
            return [await self._run_choice(p, *jobs[0], queue, cancel)]
        # concurrently, so that the engine batches them
        results = await asyncio.gather(
            *(self._run_choice(p, *job, queue, cancel) for job in jobs), return_exceptions=True
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
        put = queue.put_nowait if queue is not None else lambda frame: None  # nobody streams
        out: ChoiceOutput | None = None
        try:
            async for item in self.generator.generate(turn, i, p.stream, cancel):
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
        self.generator.count_tool_calls(choice.parser)
        await self.records.record(turn, answer, choice.parser.failures if choice.parser else 0)
        self.prompts.remember(turn, out, answer.answer_hash)  # for the turn that continues it
        if queue is not None and out.finish_reason != "abort":
            for frame in choice.done(answer):
                put(frame)
        return answer

    # ---- streaming -------------------------------------------------------------------
    async def _stream(self, p: Prepared, admitted: Admitted, tracked: Tracked) -> StreamingResponse:
        """Generate in a task of its own, so that the records are made even if the client
        leaves; the response only relays what that task queues.

        An error before the first frame (a dead engine, say) still gets its HTTP status;
        a later one becomes an error event. Generation stops once the client is gone.
        """
        queue: Frames = asyncio.Queue()
        cancel = asyncio.Event()
        self.records.spawn(self._produce(p, queue, cancel, admitted, tracked))
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
        admitted: Admitted,
        tracked: Tracked,
    ) -> None:
        try:
            for frame in self.stream_start(p):
                queue.put_nowait(frame)
            answers = await self._run_all(p, queue, cancel)
            for frame in self.stream_end(p, answers):
                queue.put_nowait(frame)
        except BaseException as exc:
            queue.put_nowait(as_api_error(exc))  # (which logs what is unexpected)
            if not isinstance(exc, Exception):  # cancelled: the task is too
                raise
        finally:
            queue.put_nowait(STREAM_END)
            admitted.release()
            tracked.done()
