"""An engine that answers instantly, for fast gateway tests and benchmarks only.

It "generates" a fixed reply (or a scripted one) as real token ids of the real
tokenizer, so everything downstream of the engine runs for real. With
`token_delay_s` it streams one token at a time, like a real engine decoding.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

from gateway.inference.base import (
    EngineError,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    TokenChunk,
    TopLogprobs,
)

Reply = list[int] | str
FAKE_LOGPROB = -0.5


MAX_CALLS_KEPT = 1024


class FakeEngine(InferenceEngine):
    name = "fake"

    def __init__(
        self,
        reply_ids: Reply | Callable[[list[int]], Reply],
        stop_id: int,
        max_context: int = 8192,
        delay_s: float = 0.0,
        token_delay_s: float = 0.0,
        encode: Callable[[str], list[int]] | None = None,
    ) -> None:
        self._reply = reply_ids
        self._stop_id = stop_id
        self._max_context = max_context
        self.delay_s = delay_s  # before the first token
        self.token_delay_s = token_delay_s  # between two tokens
        self._encode = encode
        self._script: deque[Reply] = deque()
        self.alive = True
        self._version = 0
        # the latest calls, for tests to inspect; bounded, so that a long benchmark
        # (bench/rss.py: 20,000 sessions) measures the gateway, not this history
        self.calls: list[tuple[list[int], SamplingParams]] = []

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    def bump_version(self) -> int:
        self._version += 1
        return self._version

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with these replies (text or token ids), in order."""
        self._script.extend(replies)

    async def health(self) -> bool:
        return self.alive

    def _plan(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        if not self.alive:
            raise EngineError("fake engine is down")
        self.calls.append((prompt_ids, params))
        if len(self.calls) > MAX_CALLS_KEPT:
            del self.calls[0]
        if self._script:
            reply = self._script.popleft()
        else:
            reply = self._reply(prompt_ids) if callable(self._reply) else self._reply
        if isinstance(reply, str):
            if self._encode is None:
                raise ValueError("a text reply needs FakeEngine(encode=...)")
            reply = self._encode(reply)
        out = list(reply)[: params.max_new_tokens]
        finish = "length"
        stops = set(params.stop_token_ids or ())
        cut = next((i for i, t in enumerate(out) if t in stops), None)
        if cut is not None:  # as an engine does: a stop token (harmony's `<|call|>`) ends it
            out, finish = out[: cut + 1], "stop"
        elif len(out) < params.max_new_tokens:
            out.append(self._stop_id)
            finish = "stop"
        n = len(out)
        top = None
        if params.top_logprobs:
            top = [_alternatives(t, params.top_logprobs) for t in out]
        return GenerationResult(
            out,
            [FAKE_LOGPROB] * n,
            [self._version] * n,
            finish,  # type: ignore[arg-type]
            top_logprobs=top,
        )

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> GenerationResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        result = self._plan(prompt_ids, params)
        if self.token_delay_s:
            await asyncio.sleep(self.token_delay_s * len(result.output_ids))
        return result

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        if not self.token_delay_s:
            async for item in super().stream(prompt_ids, params, route_key=route_key):
                yield item
            return
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        result = self._plan(prompt_ids, params)
        top = result.top_logprobs
        for i, tok in enumerate(result.output_ids):
            await asyncio.sleep(self.token_delay_s)
            yield TokenChunk(
                [tok],
                [result.logprobs[i]],
                [result.versions[i]],
                None if top is None else [top[i]],
            )
        yield result


def _alternatives(token_id: int, k: int) -> TopLogprobs:
    """The sampled token first, then made-up runners-up with lower logprobs."""
    return [(token_id, FAKE_LOGPROB)] + [(token_id + j, FAKE_LOGPROB - j) for j in range(1, k)]
