"""The embedded engine lets requests join a batch that is already decoding.

Agents' turns arrive staggered; before this, a request that missed a batch waited for
that batch's longest answer. What a user relies on: a request that joins mid-batch gets
the same tokens and logprobs as it would alone (its left padding is masked out), and it
does not wait for the running batch to finish.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.inference.base import SamplingParams
from gateway.inference.embedded import EmbeddedEngine


def _prompt(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


async def test_a_request_joins_a_running_batch_with_the_same_output(tokenizer) -> None:
    engine = EmbeddedEngine(None, device="cpu", max_batch_size=8)
    await engine.start()
    try:
        long_prompt = _prompt(tokenizer, "Write a short story about a cat who learns to sail.")
        short_prompt = _prompt(tokenizer, "What is 2 + 3?")  # narrower: it gets left padding
        long_params = SamplingParams(temperature=0.0, max_new_tokens=40)
        short_params = SamplingParams(temperature=0.0, max_new_tokens=12)

        alone_long = await engine.generate(long_prompt, long_params)
        alone_short = await engine.generate(short_prompt, short_params)

        waves = engine.waves
        stream = engine.stream(long_prompt, long_params)
        first = await anext(stream)  # the long request is decoding now
        assert first.token_ids == alone_long.output_ids[:1]
        arrivals: list[float] = []

        async def drain() -> list:
            out = []
            async for chunk in stream:
                out.append(chunk)
                arrivals.append(time.perf_counter())
            return out

        draining = asyncio.create_task(drain())
        joined = await engine.generate(short_prompt, short_params)
        joined_at = time.perf_counter()
        rest = await draining
        together_long = rest[-1]

        # one batch for both (or none: both may join the previous batch, whose thread can
        # still be admitting when the stream is submitted on a fast machine), and the
        # short one was answered while the long one still had tokens to come
        assert engine.waves - waves <= 1, "the second request waited for a batch of its own"
        assert joined_at < arrivals[-1], "the second request waited for the first to finish"
        # it finished while the long one was still decoding
        assert len(together_long.output_ids) == 40
        assert joined.output_ids == alone_short.output_ids
        assert joined.logprobs == pytest.approx(alone_short.logprobs, abs=2e-3)
        assert together_long.output_ids == alone_long.output_ids
        assert together_long.logprobs == pytest.approx(alone_long.logprobs, abs=2e-3)
    finally:
        await engine.close()


async def test_a_batch_stays_within_its_size_and_serves_everyone(tokenizer) -> None:
    engine = EmbeddedEngine(None, device="cpu", max_batch_size=3)
    await engine.start()
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=6)
        prompts = [_prompt(tokenizer, f"Count to {n}.") for n in range(2, 9)]
        alone = [await engine.generate(p, params) for p in prompts]

        async def staggered(i: int, p: list[int]):
            await asyncio.sleep(0.01 * i)
            return await engine.generate(p, params)

        together = await asyncio.gather(*(staggered(i, p) for i, p in enumerate(prompts)))
        assert [r.output_ids for r in together] == [r.output_ids for r in alone]
    finally:
        await engine.close()


async def test_a_shared_system_prompt_is_prefilled_once_with_the_same_output(tokenizer) -> None:
    engine = EmbeddedEngine(None, device="cpu", max_batch_size=8)
    await engine.start()
    try:
        system = "You are a careful assistant. Answer in one short sentence. " * 3

        def prompt(question: str) -> list[int]:
            text = tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": question}],
                tokenize=False,
                add_generation_prompt=True,
            )
            return tokenizer.encode(text, add_special_tokens=False)

        prompts = [prompt(q) for q in ("What is 2 + 3?", "Name a color.", "Is ice cold?")]
        params = SamplingParams(temperature=0.0, max_new_tokens=8)
        alone = [await engine.generate(p, params) for p in prompts]
        assert engine.prefix_tokens_shared == 0, "a lone request has nothing to share"

        together = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        assert engine.prefix_tokens_shared >= 3 * 40, "the system prompt was prefilled per row"
        for a, t in zip(alone, together, strict=True):
            assert t.output_ids == a.output_ids
            assert t.logprobs == pytest.approx(a.logprobs, abs=2e-3)
    finally:
        await engine.close()
