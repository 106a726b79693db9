"""The vLLM engine against a fake server speaking vLLM 0.32's token-in/token-out protocol.

Fast and deterministic: pauses mid-generation, failed loads, dead servers, several
servers. The same engine against the real vLLM server: tests/test_vllm_real.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from fake_sglang_server import next_token, token_logprob
from fake_vllm_server import FakeVLLMServer
from gateway_helpers import (
    ADMIN_KEY,
    assert_error_shape,
    bearer,
    completion_record,
    create_session,
    http_client,
)

import gateway.app
from gateway.config import GatewayConfig
from gateway.inference.base import EngineError, GenerationResult, SamplingParams, TokenChunk
from gateway.inference.vllm import VLLMEngine
from gateway.server import BackgroundGateway, free_port

PROMPT = [1, 504, 3067, 28, 17, 1045, 30]


def expected(context: list[int], n: int, weights: int) -> tuple[list[int], list[float]]:
    ctx, ids, lps = list(context), [], []
    for pos in range(n):
        tok = next_token(ctx, weights)
        ids.append(tok)
        lps.append(token_logprob(tok, pos, weights))
        ctx.append(tok)
    return ids, lps


@pytest.fixture
def fakes() -> Iterator[Callable[..., FakeVLLMServer]]:
    made: list[FakeVLLMServer] = []

    def make(**kwargs: Any) -> FakeVLLMServer:
        fake = FakeVLLMServer(**kwargs).start()
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.stop()


@contextlib.asynccontextmanager
async def running(engine: VLLMEngine) -> AsyncIterator[VLLMEngine]:
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def run(
    engine: VLLMEngine, prompt: list[int], params: SamplingParams, stream: bool, **kw: Any
) -> tuple[GenerationResult, list[TokenChunk]]:
    if not stream:
        return await engine.generate(prompt, params, **kw), []
    chunks: list[TokenChunk] = []
    result = None
    async for item in engine.stream(prompt, params, **kw):
        if isinstance(item, GenerationResult):
            result = item
        else:
            chunks.append(item)
    assert result is not None
    return result, chunks


async def wait_for_tokens(fake: FakeVLLMServer, n: int) -> None:
    deadline = time.monotonic() + 20
    while not any(len(r.output) >= n for r in fake.running()):
        assert time.monotonic() < deadline, "the fake made no tokens"
        await asyncio.sleep(0.002)


# ---- protocol ---------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_token_ids_and_logprobs_come_through_exactly(fakes, stream):
    fake = fakes()
    async with running(VLLMEngine(fake.url)) as engine:
        assert engine.max_context == fake.max_model_len  # vLLM serves up to max_model_len
        result, chunks = await run(engine, PROMPT, SamplingParams(max_new_tokens=12), stream)
    ids, lps = expected(PROMPT, 12, 0)
    assert result.output_ids == ids
    assert result.logprobs == lps
    assert result.versions == [0] * 12
    assert result.finish_reason == "length"
    if stream:
        assert [t for c in chunks for t in c.token_ids] == ids
        assert [lp for c in chunks for lp in c.logprobs] == lps


async def test_sampling_params_are_mapped_to_vllm(fakes):
    fake = fakes()
    params = SamplingParams(
        max_new_tokens=5, temperature=0.0, top_p=0.9, stop_token_ids=[2, 7], seed=11, top_logprobs=3
    )
    async with running(VLLMEngine(fake.url)) as engine:
        result = await engine.generate(PROMPT, params)
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))
    first, second = fake.generate_bodies()
    assert first == {
        "token_ids": PROMPT,
        "sampling_params": {
            "max_tokens": 5,
            "temperature": 0.0,
            "top_p": 0.9,
            "stop_token_ids": [2, 7],
            "ignore_eos": True,
            "skip_special_tokens": False,
            "detokenize": False,
            "logprobs": 4,  # vLLM counts the sampled token among them
            "seed": 11,
        },
        "output_mode": "tokens",
        "stream": False,
    }
    assert second["sampling_params"]["logprobs"] == 0  # the sampled token's only
    assert "seed" not in second["sampling_params"]
    # the 3 best alternatives, best first, whether or not the sampled token is one
    for alts in result.top_logprobs:
        assert len(alts) == 3
        assert [lp for _, lp in alts] == sorted((lp for _, lp in alts), reverse=True)


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_token_ends_with_stop(fakes, stream):
    fake = fakes(stop_after=3, eos_id=2)
    async with running(VLLMEngine(fake.url)) as engine:
        result, _ = await run(
            engine, PROMPT, SamplingParams(max_new_tokens=50, stop_token_ids=[2]), stream
        )
    assert result.output_ids == expected(PROMPT, 3, 0)[0] + [2]
    assert result.finish_reason == "stop"
    assert len(result.logprobs) == len(result.versions) == 4


# ---- weight updates ---------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_update_mid_generation_versions_old_then_new(fakes, stream):
    fake = fakes(token_delay_s=0.01, load_s=0.05)
    async with running(VLLMEngine(fake.url)) as engine:
        task = asyncio.create_task(run(engine, PROMPT, SamplingParams(max_new_tokens=40), stream))
        await wait_for_tokens(fake, 10)
        version = await engine.update_weights_from_disk("/ckpt/v1")
        result, chunks = await task
        assert version == engine.version == 1
        assert engine.resubmits == 1
    first, second = fake.generate_bodies()
    k = len(second["token_ids"]) - len(PROMPT)
    assert 10 <= k < 40
    old_ids, old_lps = expected(PROMPT, k, weights=0)
    new_ids, new_lps = expected(PROMPT + old_ids, 40 - k, weights=1)
    assert second["token_ids"] == PROMPT + old_ids
    assert second["sampling_params"]["max_tokens"] == 40 - k
    assert result.output_ids == old_ids + new_ids
    assert result.logprobs == old_lps + new_lps
    assert result.versions == [0] * k + [1] * (40 - k)
    if stream:
        assert [v for c in chunks for v in c.versions] == result.versions
    control = [p for p in fake.paths() if p != "/inference/v1/generate"]
    assert control == [
        "/pause",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
        "/resume",
    ]
    assert dict(fake.requests)["/pause"] == {"mode": "abort", "clear_cache": "true"}
    assert dict(fake.requests)["/collective_rpc"] == {
        "method": "turnstile_reload_weights",
        "kwargs": {"weights_path": "/ckpt/v1"},
    }
    assert fake.weight_version == "1"


async def test_versions_come_from_the_server_labels(fakes):
    fake = fakes()
    async with running(VLLMEngine(fake.url)) as engine:
        fake.weight_version = "9"  # another client relabelled the weights
        result = await engine.generate(PROMPT, SamplingParams(max_new_tokens=3))
        assert result.versions == [9, 9, 9]
        assert engine.version == 9


async def test_failed_reload_raises_resumes_and_keeps_version(fakes):
    fake = fakes()
    fake.fail_reload = True
    async with running(VLLMEngine(fake.url)) as engine:
        with pytest.raises(EngineError, match="collective_rpc answered 500"):
            await engine.update_weights_from_disk("/no/such/ckpt")
        assert engine.version == 0
        assert fake.paths()[-1] == "/resume"  # never left paused
        assert fake.weight_version == "default"
        result = await engine.generate(PROMPT, SamplingParams(max_new_tokens=3))
    assert result.versions == [0, 0, 0]


async def test_server_without_dev_mode_says_how_to_start_it(fakes):
    fake = fakes(dev_mode=False)
    async with running(VLLMEngine(fake.url)) as engine:
        with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
            await engine.update_weights_from_disk("/ckpt/v1")
        assert (await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))).versions == [0, 0]


async def test_sessions_stick_to_one_server_and_updates_reach_all(fakes):
    servers = [fakes() for _ in range(2)]
    async with running(VLLMEngine([s.url for s in servers])) as engine:
        for _turn in range(3):
            for session in range(4):
                await engine.generate(
                    PROMPT, SamplingParams(max_new_tokens=2), route_key=f"s{session}"
                )
        owners = {f"s{i}": engine.router.server_for(f"s{i}") for i in range(4)}
        assert await engine.update_weights_from_disk("/ckpt/1") == 1
    counts = [len(s.generate_bodies()) for s in servers]
    assert counts == [6, 6]  # two sessions x three turns on each
    assert len(set(owners.values())) == 2
    assert all(s.weights_path == "/ckpt/1" and s.weight_version == "1" for s in servers)


async def test_unreachable_server_is_an_engine_error(fakes):
    dead = f"http://127.0.0.1:{free_port()}"
    async with running(VLLMEngine(dead)) as engine:
        assert not await engine.health()
        with pytest.raises(EngineError, match="cannot reach the vLLM server"):
            await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))


def test_vllm_engine_needs_urls_and_the_cli_takes_several():
    import argparse

    from gateway.cli import add_serve_args, cmd_serve
    from gateway.inference.registry import make_inference_engine

    with pytest.raises(ValueError, match="needs the URL of a vLLM server"):
        make_inference_engine(GatewayConfig(engine="vllm"))
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    with pytest.raises(SystemExit, match="--engine-url"):
        cmd_serve(parser.parse_args(["--engine", "vllm"]))
    args = parser.parse_args(["--engine", "vllm", "--engine-url", "u1", "--engine-url", "u2"])
    engine = make_inference_engine(GatewayConfig(engine="vllm", engine_urls=args.engine_urls))
    assert isinstance(engine, VLLMEngine)
    assert engine.urls == ["http://u1", "http://u2"] and engine.router is not None


# ---- through the gateway -----------------------------------------------------------------
@pytest.fixture
def vllm_gateway(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
    started: list[BackgroundGateway] = []

    def make(*fakes_: FakeVLLMServer) -> BackgroundGateway:
        config = GatewayConfig(
            port=0,
            database=str(tmp_path / f"g{len(started)}.db"),
            admin_key=ADMIN_KEY,
            engine="vllm",
            engine_urls=[f.url for f in fakes_],
            request_timeout_s=30,
        )
        gw = BackgroundGateway(config).start()
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completion_on_vllm_is_recorded(fakes, vllm_gateway, stream):
    fake = fakes(stop_after=4, eos_id=2)
    gw = vllm_gateway(fake)
    assert isinstance(gw.engine, VLLMEngine)
    session_id, key = create_session(gw.url)
    with http_client() as client:
        body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 32}
        r = client.post(
            f"{gw.url}/chat/completions", headers=bearer(key), json=body | {"stream": stream}
        )
        assert r.status_code == 200, r.text
        if stream:
            first = next(line for line in r.text.splitlines() if line.startswith("data: {"))
            cid = json.loads(first.removeprefix("data: "))["id"]
        else:
            cid = r.json()["id"]
    sent = fake.generate_bodies()[0]
    rec = completion_record(gw, session_id, cid)
    ids, lps = expected(sent["token_ids"], 4, 0)
    assert rec["prompt_ids"] == sent["token_ids"]
    assert rec["output_ids"] == ids + [2]
    assert rec["output_logprobs"] == pytest.approx(lps + [token_logprob(2, 4, 0)], abs=1e-6)
    assert rec["output_versions"] == [0] * 5
    assert sent["stream"] is stream


def test_dead_vllm_is_503_and_the_gateway_keeps_serving(fakes, vllm_gateway):
    fake = fakes()
    gw = vllm_gateway(fake)
    _, key = create_session(gw.url)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    with http_client() as client:
        fake.fail_status = 500
        err = assert_error_shape(
            client.post(f"{gw.url}/chat/completions", headers=bearer(key), json=body), 503
        )
        assert err["code"] == "engine_unavailable"
        fake.fail_status = None
        assert (
            client.post(f"{gw.url}/chat/completions", headers=bearer(key), json=body).status_code
            == 200
        )


def test_vllm_context_refusal_is_a_400(fakes, vllm_gateway, tokenizer):
    fake = fakes(max_model_len=64)
    gw = vllm_gateway(fake)
    _, key = create_session(gw.url)
    long = " ".join(["word"] * 100)
    with http_client() as client:
        r = client.post(
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={"messages": [{"role": "user", "content": long}], "max_tokens": 4},
        )
        err = assert_error_shape(r, 400)
        assert err["code"] == "context_length_exceeded"
        assert "64 tokens" in err["message"]


def test_the_gateway_config_reaches_the_engine(monkeypatch) -> None:
    """The update servers, fallback context, request timeout and `$VLLM_API_KEY` a
    gateway is configured with are the ones its engine uses."""
    from gateway.inference.registry import make_inference_engine
    from gateway.inference.remote import ServerOptions

    monkeypatch.setenv("VLLM_API_KEY", "sekrit")
    config = GatewayConfig(
        engine="vllm",
        engine_urls=["a:8000"],
        engine_update_urls=["b:8000"],
        engine_max_context=1234,
        request_timeout_s=7.0,
    )
    engine = make_inference_engine(config)
    assert isinstance(engine, VLLMEngine)
    assert engine.options == ServerOptions(
        update_urls=("b:8000",), fallback_max_context=1234, timeout_s=7.0, api_key="sekrit"
    )
    assert engine.urls == ["http://a:8000"] and engine.update_urls == ["http://b:8000"]
    assert engine.max_context == 1234  # until a server says its own
    assert "sekrit" not in repr(engine.options)  # settings may be logged; the key may not
