"""An engine that answers instantly, for fast gateway tests and benchmarks only.

It "generates" a fixed reply (or a scripted one) as real token ids of the real
tokenizer, so everything downstream of the engine runs for real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.engines.base import EngineError, GenerationResult, InferenceEngine, SamplingParams


class FakeEngine(InferenceEngine):
    name = "fake"

    def __init__(
        self,
        reply_ids: list[int] | Callable[[list[int]], list[int]],
        stop_id: int,
        max_context: int = 8192,
        delay_s: float = 0.0,
    ) -> None:
        self._reply = reply_ids
        self._stop_id = stop_id
        self._max_context = max_context
        self.delay_s = delay_s
        self.alive = True
        self._version = 0
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

    async def health(self) -> bool:
        return self.alive

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        if not self.alive:
            raise EngineError("fake engine is down")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.calls.append((prompt_ids, params))
        reply = self._reply(prompt_ids) if callable(self._reply) else self._reply
        out = list(reply)[: params.max_new_tokens]
        finish = "length"
        if len(out) < params.max_new_tokens:
            out.append(self._stop_id)
            finish = "stop"
        n = len(out)
        return GenerationResult(out, [-0.5] * n, [self._version] * n, finish)  # type: ignore[arg-type]
