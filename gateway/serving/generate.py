"""Stage 2 of a request, generate: the engine call under a deadline (else a 503), its
tokens decoded into final text deltas (no split characters, cut at a stop string), then
one `ChoiceOutput`. The model's reasoning and tool-call formats are read here too
(`output_parser`): decoding an answer means knowing them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from typing import Any, NamedTuple

from gateway.chat.detokenize import IncrementalDecoder
from gateway.chat.families import make_reasoning_parser, make_tool_parser
from gateway.chat.output_parser import OutputParser
from gateway.chat.template import ChatRenderer
from gateway.config import GatewayConfig
from gateway.errors import APIError
from gateway.inference.base import (
    ContextLengthExceeded,
    EngineError,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    TokenChunk,
    TopLogprobs,
)
from gateway.metrics import Metrics
from gateway.serving.turn import ChoiceOutput, TextDelta, Turn


class Sampling(NamedTuple):
    """What a request asks of generation besides temperature, top_p and seed (which
    every request model names alike), in its own API's fields."""

    max_tokens: int | None
    top_logprobs: int = 0
    stops: list[str] | None = None


class Generator:
    def __init__(
        self,
        engine: InferenceEngine,
        renderer: ChatRenderer,
        metrics: Metrics,
        config: GatewayConfig,
    ) -> None:
        self.engine, self.renderer, self.metrics = engine, renderer, metrics
        self.default_max_tokens = config.default_max_tokens
        self.request_timeout_s = config.request_timeout_s
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

    def params(self, prompt_len: int, req: Any, sampling: Sampling, param: str) -> SamplingParams:
        """The engine's sampling params; a prompt that leaves no room is a 400 on `param`."""
        asked = sampling.max_tokens or self.default_max_tokens
        try:
            max_new = self.engine.check_fits(prompt_len, asked)
        except ContextLengthExceeded as exc:
            raise APIError(400, str(exc), code="context_length_exceeded", param=param) from exc
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            stop_token_ids=self.renderer.stop_token_ids,
            seed=req.seed,
            top_logprobs=sampling.top_logprobs,
        )

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

    async def generate(
        self, turn: Turn, index: int, stream: bool, cancel: asyncio.Event | None = None
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

        def delta(text: str) -> TextDelta:
            """`text`, with the output tokens kept since the last delta behind it."""
            end = len(decoder.kept_ids)
            tops = None if top is None else top[sent:end]
            return TextDelta(text, decoder.kept_ids[sent:end], logprobs[sent:end], tops)

        chunks = self._engine_chunks(turn, params, stream or bool(turn.stops))
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
                    yield delta(text)
                    sent = len(decoder.kept_ids)
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
            yield delta(tail)
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
        self, turn: Turn, params: SamplingParams, stream: bool
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        deadline = time.monotonic() + self.request_timeout_s
        if not stream:
            result = await self._bounded(
                self.engine.generate(turn.prompt_ids, params, route_key=turn.session_id),
                deadline,
            )
            yield TokenChunk(
                result.output_ids, result.logprobs, result.versions, result.top_logprobs
            )
            yield result
            return
        it = self.engine.stream(turn.prompt_ids, params, route_key=turn.session_id)
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
            raise APIError(400, str(exc), code="context_length_exceeded") from exc


def _stop_string(decoder: IncrementalDecoder) -> str | None:
    """Which of the request's stop strings ended the text (at the decoder's cut)."""
    assert decoder.cut is not None
    return next((s for s in decoder.stops if decoder.text.startswith(s, decoder.cut)), None)
