"""The steps every endpoint's template (serving/endpoint.py) is built from.

A request becomes a `Turn` (prompt ids, sampling params, stop strings, parent, one
completion id per choice); then, for each choice:

1. `generate(turn, index)` calls the engine under a deadline (failures -> 503),
   streams text as it becomes final and cuts it at stop strings;
2. `record(turn, output, ...)` commits the record before the endpoint answers, and
   keeps going when the client has already left.

Around that: `admit` (429 when too much is generating), `find_parent` (the earlier
turn this request continues), and `track` / `replay_of` (a client retry of a request
is answered from the original's record instead of becoming a second sample).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import replace
from typing import Any

from fastapi.concurrency import run_in_threadpool

from gateway.chat.detokenize import IncrementalDecoder
from gateway.chat.drift import drift
from gateway.chat.families import make_reasoning_parser, make_tool_parser
from gateway.chat.linking import ConversationHash, answer_positions, framed, last_answer
from gateway.chat.output_parser import OutputParser
from gateway.chat.template import ChatRenderer, Rendered
from gateway.config import HISTORY_MODES, GatewayConfig
from gateway.errors import APIError, store_unavailable, store_unavailable_error
from gateway.inference.base import (
    ContextLengthExceeded,
    EngineError,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    TokenChunk,
    TopLogprobs,
)
from gateway.lru import LRU
from gateway.metrics import Metrics
from gateway.serving.quotas import QuotaGuard
from gateway.serving.turn import (
    ChoiceOutput,
    Link,
    Parent,
    TextDelta,
    Turn,
    completion_record,
    text_delta,
)
from gateway.signing import Signer
from gateway.store.inflight import InflightMarks
from gateway.store.recorder import Recorder, RecordError
from gateway.store.repository import Repository, SessionInfo

log = logging.getLogger(__name__)
# how often a retry looks whether its original, generating on another replica, is done
RETRY_POLL_S = 0.1


class Admission:
    """A request's share of `max_pending_requests` and of its session's quotas;
    released exactly once."""

    def __init__(self, core: ServingCore, n: int, session_id: str | None = None) -> None:
        self._core, self._n, self._session_id = core, n, session_id

    def release(self) -> None:
        if self._n:
            self._core.pending -= self._n
            self._n = 0
            if self._session_id is not None:
                self._core.quotas.release(self._session_id)

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Tracked:
    """An in-flight request a retry can wait for: in this process (a future) and, on a
    shared store, on every replica (a mark in the store, `publish()`)."""

    def __init__(self, core: ServingCore, key: tuple[str, str] | None) -> None:
        self._core, self._key = core, key
        self.future: asyncio.Future[None] | None = None
        self._mark: str | None = None
        self._renewing: asyncio.Task[None] | None = None
        if key is not None:
            self.future = asyncio.get_running_loop().create_future()
            core._inflight[key] = self.future

    async def publish(self) -> None:
        """Let other replicas' retries of this request wait for it (shared store only)."""
        if self._key is not None and self._core.marks.shared:
            self._mark = await run_in_threadpool(self._core.marks.mark, *self._key)
            self._renewing = self._core.spawn(self._renew(self._mark))

    async def _renew(self, mark: str) -> None:
        """Keep the mark's lease while generating (a dead replica's lapses)."""
        marks = self._core.marks
        while True:
            await asyncio.sleep(marks.lease_s / 3)
            try:
                await run_in_threadpool(marks.renew, mark)
            except Exception as exc:  # the store is down: the record will say so
                log.warning("could not renew in-flight mark: %s", exc)

    def done(self) -> None:
        if self.future is None or self.future.done():
            return
        self.future.set_result(None)
        if self._core._inflight.get(self._key) is self.future:  # type: ignore[arg-type]
            del self._core._inflight[self._key]  # type: ignore[arg-type]
        if self._renewing is not None:
            self._renewing.cancel()
        if self._mark is not None:  # after the records: a waiting retry then finds them
            self._core.spawn(run_in_threadpool(self._core.marks.clear, self._mark))

    def __enter__(self) -> Tracked:
        return self

    def __exit__(self, *_: object) -> None:
        self.done()


class ServingCore:
    def __init__(
        self,
        engine: InferenceEngine,
        renderer: ChatRenderer,
        repo: Repository,
        recorder: Recorder,
        metrics: Metrics,
        config: GatewayConfig,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.repo = repo
        self.recorder = recorder
        self.metrics = metrics
        self.default_max_tokens = config.default_max_tokens
        self.request_timeout_s = config.request_timeout_s
        self.max_pending = config.max_pending_requests
        self.max_n = config.max_n
        self.tool_parser_name = (
            renderer.tool_parser if config.tool_parser == "auto" else config.tool_parser
        )
        make_tool_parser(self.tool_parser_name)  # an unknown name fails at start-up
        self.reasoning_parser_name: str | None = {
            "auto": renderer.reasoning_parser,
            "none": None,
        }.get(config.reasoning_parser, config.reasoning_parser)
        if self.reasoning_parser_name is not None:
            make_reasoning_parser(self.reasoning_parser_name)
        if config.history not in HISTORY_MODES:
            raise ValueError(f"history {config.history!r}: one of {HISTORY_MODES}")
        self.history = config.history
        self.pending = 0
        self.quotas = QuotaGuard()
        # the keys of the signatures the gateway hands out (its thinking blocks)
        self.signing = Signer(repo, config.signing_keys, config.signing_key_grace_s)
        # (session id, answer hash) -> parent; saves a DB read per turn.
        self._recent: LRU[tuple[str, str], Parent] = LRU(
            config.parent_cache_size,
            max_weight=config.parent_cache_tokens,
            weigh=lambda p: len(p.prompt_ids) + len(p.output_ids),
        )
        # (session id, messages before the answer) -> the answers' hashes, newest last:
        # where a request's conversation hash resumes from (`link`)
        self._answered: LRU[tuple[str, int], list[str]] = LRU(config.parent_cache_size)
        # (session id, body hash) -> the original a retry waits for. Not an LRU: an entry
        # lives while its request generates, so `max_pending_requests` bounds them.
        self._inflight: dict[tuple[str, str], asyncio.Future[None]] = {}
        # the same, across the replicas of a shared store (leases: a dead replica's
        # marks lapse within seconds)
        self.marks = InflightMarks(repo.engine)
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- before generating -----------------------------------------------------------
    def admit(self, session: SessionInfo, turns: list[Turn], per_turn: int) -> Admission:
        """429 when the gateway is full or a session quota is spent; a session with a
        token quota has each answer capped at the tokens it has left.

        Synchronous: the checks and the counts they guard change together. So a
        session with quotas reads its usage on the event loop (one indexed query, as a
        key-cache miss does); an await between that read and the count would let a
        request that finishes meanwhile be counted neither as recorded nor in flight."""
        recorded = self.repo.session_usage(session.id) if session.quotas else None
        n = len(turns) * per_turn
        self._admit_pending(n)
        if recorded is None:
            return Admission(self, n)
        try:
            budget = self.quotas.reserve(session, n, recorded)
        except APIError:
            self.pending -= n
            raise
        if budget is not None:
            for turn in turns:
                cap = min(turn.params.max_new_tokens, budget)
                turn.params = replace(turn.params, max_new_tokens=cap)
        return Admission(self, n, session.id)

    def _admit_pending(self, n: int) -> None:
        if self.pending + n > self.max_pending:
            self.metrics.inc("turnstile_rejected_requests_total")
            raise APIError(
                429,
                f"The gateway is already generating {self.pending} answers "
                f"(limit {self.max_pending}); retry shortly.",
                code="too_many_pending_requests",
                headers={"retry-after": "1"},
            )
        self.pending += n

    def sampling_params(
        self,
        prompt_len: int,
        *,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        top_logprobs: int = 0,
        param: str = "messages",
    ) -> SamplingParams:
        try:
            max_new = self.engine.check_fits(prompt_len, max_tokens or self.default_max_tokens)
        except ContextLengthExceeded as exc:
            raise APIError(
                400, str(exc), code="context_length_exceeded", param=param, retryable=False
            ) from exc
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            stop_token_ids=self.renderer.stop_token_ids,
            seed=seed,
            top_logprobs=top_logprobs,
        )

    @staticmethod
    def force_sampling(turn: Turn, forced: dict[str, Any]) -> None:
        """The session's own sampling settings win over the request's; the record says
        what was used (its request keeps the client's values under `client_sampling`)."""
        turn.params = replace(turn.params, **forced)
        asked = {k: turn.request.get(k) for k in forced}
        turn.request = {**turn.request, **forced, "client_sampling": asked}

    async def link(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> tuple[ConversationHash, Link | None]:
        """The request's conversation hash and the parent it continues.

        The hash resumes from a parent this process answered when the request repeats
        that parent's messages and answer (its last assistant message): a long session
        hashes only its new messages each turn."""
        k = last_answer(messages)
        answered = self._answered.get((session_id, k)) if k is not None else None
        if answered:
            answer = framed(messages[k])
            for h in reversed(answered):
                parent = self._recent.get((session_id, h))
                resume = parent.conversation if parent is not None else None
                if resume is not None and resume.continued_by(messages, tools, answer):
                    return ConversationHash(messages, tools, resume), Link(parent, 0)
        hashes = ConversationHash(messages, tools)
        return hashes, await self.find_parent(session_id, hashes.candidates)

    async def find_parent(self, session_id: str, hashes: list[str]) -> Link | None:
        """The latest recorded answer whose (request + answer) hash is in `hashes`
        (longest prefix first).

        A cached hit on the longest prefix is the answer. A hit further down is only an
        ancestor this process served: a longer prefix may have been answered by another
        replica of a shared store, so the store is asked about those first.
        """
        for rank, h in enumerate(hashes):
            hit = self._recent.get((session_id, h))
            if hit is not None:
                if rank == 0:
                    return Link(hit, 0)
                return await self._stored_parent(session_id, hashes[:rank]) or Link(hit, rank)
        return await self._stored_parent(session_id, hashes)

    async def _stored_parent(self, session_id: str, hashes: list[str]) -> Link | None:
        """The store's answer, asked off the event loop: a shared PostgreSQL is a network
        round trip away, and every other request would wait for it."""
        if not hashes:
            return None
        found = await asyncio.to_thread(self.repo.find_parent, session_id, hashes)
        if found is None:
            return None
        cid, full, rank = found
        return Link(Parent(cid, full.prompt_ids, full.output_ids, full.request), rank)

    def history_of(self, session: SessionInfo) -> str:
        """How this session's prompts are built: its own choice, else the gateway's."""
        return session.history or self.history

    # ---- retries ---------------------------------------------------------------------
    def track(self, session_id: str, body_hash: str | None) -> Tracked:
        return Tracked(self, None if body_hash is None else (session_id, body_hash))

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        *,
        param: str,
        code: str,
        link: Link | None = None,
        history: str = "template",
    ) -> Rendered:
        """The prompt: with `history="token_exact"`, the parent's ids + the new messages
        (when that can be told, else a counted fallback); otherwise the template's,
        on the parent's tokens where it provably continues them. A template that
        cannot render the request is the client's 400."""
        try:
            if history == "token_exact" and link is not None:
                rendered = self._token_exact(messages, tools, tool_choice, link)
                if rendered.fallback is None:
                    return rendered
                template = self._template(messages, tools, tool_choice, link)
                return replace(template, fallback=rendered.fallback)
            return self._template(messages, tools, tool_choice, link)
        except Exception as exc:  # jinja errors, bad message shapes
            raise APIError(
                400,
                f"could not apply the chat template: {exc}",
                code=code,
                param=param,
                retryable=False,
            ) from exc

    def _token_exact(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        link: Link,
    ) -> Rendered:
        start = answer_positions(messages)[link.rank] + 1
        prompt_ids, output_ids = link.parent.prompt_ids, link.parent.output_ids
        rendered = self.renderer.render_token_exact(
            messages, start, (prompt_ids, output_ids), tools, tool_choice
        )
        kind = "fallbacks" if rendered.fallback else "built"
        self.metrics.inc(f"turnstile_prompts_token_exact_{kind}_total")
        return rendered

    def _template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        link: Link | None,
    ) -> Rendered:
        parent = link.parent if link is not None else None
        on = (
            (parent.prompt_ids, parent.output_ids, parent.prefix)
            if parent is not None and parent.prefix is not None
            else None
        )
        rendered = self.renderer.render(messages, tools, tool_choice, on)
        if on is not None:
            kind = "incremental" if rendered.incremental else "fallbacks"
            self.metrics.inc(f"turnstile_prompts_{kind}_total")
        return rendered

    def drift(self, parent: Parent, prompt_ids: list[int]) -> dict[str, Any] | None:
        """Where (and why) this prompt, which does not continue its parent's tokens,
        leaves them; counted in /metrics."""
        decode = self.renderer.decode
        calls = make_tool_parser(self.tool_parser_name)
        calls.feed(decode(parent.output_ids))
        calls.finish()
        found = drift(
            parent.prompt_ids, parent.output_ids, prompt_ids, decode, bool(calls.tool_calls)
        )
        if found is not None:
            self.metrics.inc("turnstile_prompt_drift_total")
            self.metrics.inc(f"turnstile_prompt_drift_{found['cause'] or 'unknown'}_total")
        return found

    def output_parser(self, prompt_text: str | None, tools: bool) -> OutputParser | None:
        """A parser for this model's reasoning (if it has a format) and, when the
        request may call tools, its tool calls; None when there is nothing to parse."""
        reasoning = None
        if self.reasoning_parser_name is not None:
            reasoning = make_reasoning_parser(self.reasoning_parser_name, prompt_text or "")
        calls = make_tool_parser(self.tool_parser_name) if tools else None
        if reasoning is None and calls is None:
            return None
        return OutputParser(reasoning, calls)

    def count_tool_calls(self, parser: OutputParser | None) -> None:
        if parser is None:
            return
        if parser.failures:
            self.metrics.inc("turnstile_tool_call_parse_failures_total", parser.failures)
        if parser.tool_calls:
            self.metrics.inc("turnstile_tool_calls_total", len(parser.tool_calls))

    async def replay_of(
        self, session_id: str, body_hash: str | None, retry_count: int, n: int
    ) -> list[dict[str, Any]] | None:
        """For a client retry (retry count > 0): the original's recorded choices, if all
        of them were completed. Waits for the original while it is still generating."""
        if retry_count <= 0 or body_hash is None:
            return None
        inflight = self._inflight.get((session_id, body_hash))
        if inflight is not None:
            await asyncio.shield(inflight)
        elif self.marks.shared:  # the original may be generating on another replica
            deadline = time.monotonic() + self.request_timeout_s
            while time.monotonic() < deadline and await run_in_threadpool(
                self.marks.pending, session_id, body_hash
            ):
                await asyncio.sleep(RETRY_POLL_S)
        rows = await run_in_threadpool(self.repo.request_rows, session_id, body_hash, n)
        if not rows or any(r["finish_reason"] == "abort" for r in rows):
            return None
        self.metrics.inc("turnstile_retries_replayed_total")
        return rows

    # ---- generating ------------------------------------------------------------------
    async def generate(
        self,
        turn: Turn,
        index: int,
        *,
        stream: bool = False,
        cancel: asyncio.Event | None = None,
    ) -> AsyncIterator[TextDelta | ChoiceOutput]:
        """Text deltas as they become final, then the choice's output.

        With `stream=False` and no stop strings, the engine is called once; otherwise
        tokens are consumed as they come and generation stops at a stop string, or when
        `cancel` is set (the client left: the output so far is returned as `abort`).
        """
        params = turn.params
        if index and params.seed is not None:  # distinct, reproducible choices
            params = replace(params, seed=params.seed + index)
        decoder = IncrementalDecoder(self.renderer.decode, self.renderer.stop_token_ids, turn.stops)
        logprobs: list[float] = []
        versions: list[int] = []
        top: list[TopLogprobs] | None = [] if params.top_logprobs else None
        sent = 0  # output tokens already covered by a delta
        result: GenerationResult | None = None
        aborted = False
        began = time.perf_counter()
        chunks = self._engine_chunks(
            turn.prompt_ids, params, stream or bool(turn.stops), turn.session_id
        )
        try:
            async for item in chunks:
                if isinstance(item, GenerationResult):
                    result = item
                    break
                logprobs += item.logprobs
                versions += item.versions
                if top is not None:
                    top += item.top_logprobs or [[] for _ in item.token_ids]
                text = decoder.feed(item.token_ids)
                if text:
                    kept = decoder.kept_ids
                    yield text_delta(text, kept, logprobs, top, sent, len(kept))
                    sent = len(kept)
                if decoder.stopped:
                    break
                if cancel is not None and cancel.is_set():
                    aborted = True
                    break
        finally:
            await chunks.aclose()
        tail = decoder.finish()
        kept = decoder.kept_ids
        n = len(kept)
        if tail or sent < n:
            yield text_delta(tail, kept, logprobs, top, sent, n)
        if decoder.stopped:
            finish = "stop"
        elif aborted:
            finish = "abort"
        else:
            finish = result.finish_reason if result is not None else "stop"
        yield ChoiceOutput(
            index=index,
            completion_id=turn.ids[index],
            text=decoder.final_text,
            output_ids=kept,
            logprobs=logprobs[:n],
            versions=versions[:n],
            top_logprobs=None if top is None else top[:n],
            finish_reason=finish,
            stop_string=_stop_string(decoder) if decoder.stopped else None,
            queue_s=result.queue_s if result is not None else 0.0,
            gen_s=result.gen_s if result is not None else time.perf_counter() - began,
        )

    async def _engine_chunks(
        self, prompt_ids: list[int], params: SamplingParams, stream: bool, route_key: str
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        deadline = time.monotonic() + self.request_timeout_s
        if not stream:
            result = await self._bounded(
                self.engine.generate(prompt_ids, params, route_key=route_key), deadline
            )
            yield TokenChunk(
                result.output_ids, result.logprobs, result.versions, result.top_logprobs
            )
            yield result
            return
        it = self.engine.stream(prompt_ids, params, route_key=route_key)
        try:
            while True:
                try:
                    item = await self._bounded(it.__anext__(), deadline)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            await it.aclose()

    async def _bounded(self, awaitable: Awaitable[Any], deadline: float) -> Any:
        try:
            # in this task: `wait_for` made a task of its own for every engine call
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                return await awaitable
        except TimeoutError as exc:
            self.metrics.inc("turnstile_engine_errors_total")
            raise APIError(
                503,
                f"the inference engine did not answer within {self.request_timeout_s:g} s",
                code="engine_timeout",
            ) from exc
        except EngineError as exc:
            self.metrics.inc("turnstile_engine_errors_total")
            raise APIError(
                503, f"the inference engine is unavailable: {exc}", code="engine_unavailable"
            ) from exc
        except ContextLengthExceeded as exc:  # an external engine's own refusal
            raise APIError(400, str(exc), code="context_length_exceeded", retryable=False) from exc

    # ---- recording -------------------------------------------------------------------
    async def record(
        self,
        turn: Turn,
        out: ChoiceOutput,
        response: dict[str, Any],
        finish_reason: str,
        answer_hash: str,
        tool_parse_failures: int = 0,
    ) -> None:
        """Commit one choice; return only once it is durable (RecordError -> 503).

        A client that disconnects does not cancel its record (see `Recorder.record`).
        """
        record = completion_record(
            turn, out, response, finish_reason, answer_hash, tool_parse_failures
        )
        try:
            await self.recorder.record(record)
        except RecordError as exc:
            self.metrics.inc("turnstile_record_failures_total")
            if exc.cause is not None and store_unavailable(exc.cause):
                raise store_unavailable_error(exc.cause) from exc
            raise APIError(503, str(exc), code="record_failed") from exc
        self._remember(turn, out, answer_hash)
        self.metrics.inc("turnstile_completions_total")
        if out.index == 0:  # the choices of one request share its prompt
            self.metrics.inc("turnstile_prompt_tokens_total", len(turn.prompt_ids))
        self.metrics.inc("turnstile_completion_tokens_total", len(out.output_ids))
        self.metrics.observe("turnstile_completion_seconds", time.perf_counter() - turn.started)

    def _remember(self, turn: Turn, out: ChoiceOutput, answer_hash: str) -> None:
        """Keep the answer for its child: its tokens, its text prefix and its hash state."""
        prefix = None
        if turn.rendered is not None and turn.history != "token_exact":
            # (a token_exact prompt's text is only its new messages': no prefix to give)
            prefix = self.renderer.text_prefix(turn.rendered, out.output_ids)
        resume = turn.conversation.resume_point(answer_hash) if turn.conversation else None
        output_ids = self.renderer.interned(out.output_ids)  # (see ChatRenderer.interned)
        parent = Parent(
            out.completion_id,
            turn.prompt_ids,
            output_ids,
            turn.request,
            prefix,
            resume,
            turn.lists_json,
        )
        self._recent.put((turn.session_id, answer_hash), parent)
        if resume is not None:
            key = (turn.session_id, len(resume.messages))
            answered = self._answered.get(key) or []
            # one entry per choice of a request; a few more for re-sent turns
            self._answered.put(key, [*answered[-2 * self.max_n :], answer_hash])

    # ---- background work -------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run work that must finish even if its client leaves (e.g. a stream's records)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _stop_string(decoder: IncrementalDecoder) -> str | None:
    """Which of the request's stop strings ended the text (at the decoder's cut)."""
    assert decoder.cut is not None
    return next((s for s in decoder.stops if decoder.text.startswith(s, decoder.cut)), None)
