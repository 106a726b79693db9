"""The SGLang engine against a fake server that speaks SGLang's native protocol.

(SGLang itself needs a GPU; tests/fake_sglang_server.py says where its protocol was
read from.) Also: the gateway serving and recording on the SGLang engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from fake_sglang_server import FakeSGLangServer, next_token, token_logprob, top_alternatives
from gateway_helpers import (
    ADMIN_KEY,
    admin_headers,
    assert_error_shape,
    bearer,
    completion_record,
    create_session,
    http_client,
)

import gateway.app
from gateway.config import GatewayConfig
from gateway.inference.base import (
    ContextLengthExceeded,
    EngineError,
    GenerationResult,
    SamplingParams,
    TokenChunk,
)
from gateway.inference.remote import ServerOptions
from gateway.inference.routing import StickyRouter
from gateway.inference.sglang import SGLangEngine
from gateway.server import BackgroundGateway, free_port

PROMPT = [1, 504, 3067, 28, 17, 1045, 30]


def expected(context: list[int], n: int, weights: int) -> tuple[list[int], list[float]]:
    """What the fake model makes: n tokens after `context` with these weights."""
    ctx, ids, lps = list(context), [], []
    for pos in range(n):
        tok = next_token(ctx, weights)
        ids.append(tok)
        lps.append(token_logprob(tok, pos, weights))
        ctx.append(tok)
    return ids, lps


@pytest.fixture
def fakes() -> Iterator[Callable[..., FakeSGLangServer]]:
    made: list[FakeSGLangServer] = []

    def make(**kwargs: Any) -> FakeSGLangServer:
        fake = FakeSGLangServer(**kwargs).start()
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.stop()


@contextlib.asynccontextmanager
async def running(engine: SGLangEngine) -> AsyncIterator[SGLangEngine]:
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def run(
    engine: SGLangEngine, prompt: list[int], params: SamplingParams, stream: bool, **kw: Any
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


async def wait_for_tokens(fake: FakeSGLangServer, n: int) -> None:
    deadline = time.monotonic() + 20
    while fake.tokens_made < n:
        assert time.monotonic() < deadline, "the fake made no tokens"
        await asyncio.sleep(0.002)


# ---- protocol: ids, logprobs, params ---------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("incremental", [False, True])
async def test_token_ids_and_logprobs_come_through_exactly(fakes, stream, incremental):
    fake = fakes(incremental=incremental)
    async with running(SGLangEngine(fake.url)) as engine:
        assert engine.max_context == fake.context_length - 1  # SGLang refuses n + max >= ctx
        result, chunks = await run(engine, PROMPT, SamplingParams(max_new_tokens=12), stream)
    ids, lps = expected(PROMPT, 12, 0)
    assert result.output_ids == ids
    assert result.logprobs == lps  # exactly the numbers the server sent
    assert result.versions == [0] * 12
    assert result.finish_reason == "length"
    if stream:
        assert len(chunks) == 12  # one event per token, none repeated
        assert [t for c in chunks for t in c.token_ids] == ids
        assert [lp for c in chunks for lp in c.logprobs] == lps


async def test_sampling_params_are_mapped_to_sglang(fakes):
    fake = fakes()
    params = SamplingParams(
        max_new_tokens=5, temperature=0.0, top_p=0.9, stop_token_ids=[2, 7], seed=11, top_logprobs=3
    )
    async with running(SGLangEngine(fake.url)) as engine:
        result = await engine.generate(PROMPT, params, route_key="sess-1")
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))
    first, second = fake.generate_bodies()
    assert first == {
        "input_ids": PROMPT,
        "sampling_params": {
            "max_new_tokens": 5,
            "temperature": 0.0,
            "top_p": 0.9,
            "stop_token_ids": [2, 7],
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "sampling_seed": 11,
        },
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": False,
        "top_logprobs_num": 3,
    }
    assert "sampling_seed" not in second["sampling_params"]
    assert "top_logprobs_num" not in second
    assert fake.routing_keys == ["sess-1", None]  # sglang-router's sticky-session header
    ids, _ = expected(PROMPT, 5, 0)
    assert result.top_logprobs == [
        [(t[1], t[0]) for t in top_alternatives(tok, pos, 0, 3)] for pos, tok in enumerate(ids)
    ]


async def test_seed_can_be_left_out_for_older_servers(fakes):
    fake = fakes()
    async with running(SGLangEngine(fake.url, send_seed=False)) as engine:
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=2, seed=3))
    assert "sampling_seed" not in fake.generate_bodies()[0]["sampling_params"]


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_token_ends_with_stop(fakes, stream):
    fake = fakes(stop_after=3, eos_id=2)
    async with running(SGLangEngine(fake.url)) as engine:
        result, _ = await run(
            engine, PROMPT, SamplingParams(max_new_tokens=50, stop_token_ids=[2]), stream
        )
    assert result.output_ids == expected(PROMPT, 3, 0)[0] + [2]
    assert result.finish_reason == "stop"
    assert len(result.logprobs) == len(result.versions) == 4


# ---- weight updates --------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("server_reports_version", [True, False])
async def test_update_mid_generation_versions_old_then_new(fakes, stream, server_reports_version):
    fake = fakes(token_delay_s=0.01, report_weight_version=server_reports_version, load_s=0.05)
    async with running(SGLangEngine(fake.url)) as engine:
        task = asyncio.create_task(run(engine, PROMPT, SamplingParams(max_new_tokens=40), stream))
        await wait_for_tokens(fake, 10)
        version = await engine.update_weights_from_disk("/ckpt/step-1")
        result, chunks = await task
        assert version == engine.version == 1
        assert engine.resubmits == 1
    first, second = fake.generate_bodies()
    k = len(second["input_ids"]) - len(PROMPT)
    assert 10 <= k < 40
    # The aborted request came back with its partial output; the rest was asked for
    # with that output appended to the prompt.
    old_ids, old_lps = expected(PROMPT, k, weights=0)
    new_ids, new_lps = expected(PROMPT + old_ids, 40 - k, weights=1)
    assert second["input_ids"] == PROMPT + old_ids
    assert second["sampling_params"]["max_new_tokens"] == 40 - k
    assert result.output_ids == old_ids + new_ids
    assert result.logprobs == old_lps + new_lps
    assert result.versions == [0] * k + [1] * (40 - k)
    assert result.finish_reason == "length"
    if stream:
        assert [v for c in chunks for v in c.versions] == result.versions
    assert fake.paths()[-4:-1] == [
        "/pause_generation",
        "/update_weights_from_disk",
        "/continue_generation",
    ]
    pause = dict(fake.requests)["/pause_generation"]
    assert pause == {"mode": "abort"}
    update = dict(fake.requests)["/update_weights_from_disk"]
    assert update == {
        "model_path": "/ckpt/step-1",
        "abort_all_requests": False,  # paused already: nothing left to abort
        "weight_version": "1",
    }


async def test_without_pause_endpoint_update_aborts_and_resubmits(fakes):
    fake = fakes(token_delay_s=0.01, support_pause=False, report_weight_version=False)
    async with running(SGLangEngine(fake.url)) as engine:
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=30)))
        await wait_for_tokens(fake, 8)
        assert await engine.update_weights_from_disk("/ckpt/a", version=7) == 7
        result = await task
        assert engine.pause_supported == {fake.url: False}
        assert await engine.update_weights_from_disk("/ckpt/b") == 8
    assert "/pause_generation" not in fake.paths()  # it 404'd: not recorded
    assert "/continue_generation" not in fake.paths()
    updates = [b for p, b in fake.requests if p == "/update_weights_from_disk"]
    assert [u["abort_all_requests"] for u in updates] == [True, True]
    k = len(fake.generate_bodies()[1]["input_ids"]) - len(PROMPT)
    assert 8 <= k < 30
    assert result.versions == [0] * k + [7] * (30 - k)
    old_ids, _ = expected(PROMPT, k, 0)
    assert result.output_ids == old_ids + expected(PROMPT + old_ids, 30 - k, 1)[0]


async def test_requests_made_during_an_update_get_the_new_version(fakes):
    fake = fakes(load_s=0.3)
    async with running(SGLangEngine(fake.url)) as engine:
        update = asyncio.create_task(engine.update_weights_from_disk("/ckpt/x"))
        await asyncio.sleep(0.1)  # the update is loading: new requests wait for it
        result = await engine.generate(PROMPT, SamplingParams(max_new_tokens=4))
        assert await update == 1
    assert result.versions == [1] * 4
    assert result.output_ids == expected(PROMPT, 4, weights=1)[0]


async def test_failed_update_raises_resumes_and_keeps_version(fakes):
    fake = fakes()
    fake.fail_update = True
    async with running(SGLangEngine(fake.url)) as engine:
        with pytest.raises(EngineError, match="Failed to get weights iterator"):
            await engine.update_weights_from_disk("/no/such/ckpt")
        assert engine.version == 0
        assert fake.paths()[-1] == "/continue_generation"  # never left paused
        result = await engine.generate(PROMPT, SamplingParams(max_new_tokens=3))
    assert result.versions == [0, 0, 0]


async def test_version_continues_from_the_server_weight_version(fakes):
    fake = fakes()
    fake.weight_version = "41"  # set by an earlier trainer run
    async with running(SGLangEngine(fake.url)) as engine:
        assert engine.version == 41
        assert await engine.update_weights_from_disk("/ckpt/next") == 42


# ---- several servers ---------------------------------------------------------------------
def test_sticky_router_least_loaded_then_sticky_and_lru_bounded():
    router = StickyRouter(["a", "b", "c"], max_keys=4)
    first = {key: router.pick(key) for key in "pqrs"}
    assert len(set(first.values())) == 3  # new keys go where the fewest keys are
    assert all(router.pick(key) == url for key, url in first.items())
    router.acquire("a")
    router.acquire("a")
    assert router.pick("new") != "a"  # least loaded first
    assert router.server_for("p") is None  # the least recently used key went
    assert len(router) == 4
    router.mark_down(router.server_for("q"))
    moved = router.pick("q")
    assert moved != first["q"]


async def test_sessions_stick_to_one_server_and_spread_across_servers(fakes):
    servers = [fakes() for _ in range(3)]
    async with running(SGLangEngine([s.url for s in servers])) as engine:
        for _turn in range(3):
            for session in range(6):
                await engine.generate(
                    PROMPT, SamplingParams(max_new_tokens=2), route_key=f"s{session}"
                )
        assert await engine.update_weights_from_disk("/ckpt/1") == 1
        engine.forget_route("s0")  # an ended session's server is forgotten, the others kept
        assert engine.router.server_for("s0") is None and len(engine.router) == 5
        assert sum(engine.router.assigned.values()) == 5
    seen = {}
    for index, server in enumerate(servers):
        keys = server.routing_keys
        assert len(keys) == 6  # two sessions x three turns each
        assert len(set(keys)) == 2
        for key in keys:
            assert seen.setdefault(key, index) == index  # one server per session
        # Weight updates go to every server.
        assert server.paths().count("/update_weights_from_disk") == 1
    assert len(seen) == 6


async def test_unreachable_server_is_skipped(fakes):
    live = fakes()
    dead = f"http://127.0.0.1:{free_port()}"
    async with running(SGLangEngine([dead, live.url])) as engine:
        results = [
            await engine.generate(PROMPT, SamplingParams(max_new_tokens=2), route_key=f"k{i}")
            for i in range(4)
        ]
        assert all(r.output_ids == expected(PROMPT, 2, 0)[0] for r in results)
        assert all(engine.router.server_for(f"k{i}") == live.url for i in range(4))
        assert await engine.health()  # one server can still serve


async def test_router_url_sends_weight_updates_to_its_workers(fakes):
    workers = [fakes(), fakes()]
    router = fakes(workers=[w.url for w in workers])  # lists its workers like sglang-router
    async with running(SGLangEngine(router.url)) as engine:
        assert engine.router is None  # one URL: used as is
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=2), route_key="s")
        assert await engine.update_weights_from_disk("/ckpt/1") == 1
    assert router.routing_keys == ["s"]
    assert "/update_weights_from_disk" not in router.paths()
    for w in workers:
        assert w.paths() == [
            "/pause_generation",
            "/update_weights_from_disk",
            "/continue_generation",
        ]


# ---- errors ------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_context_refusal_is_context_length_exceeded(fakes, stream):
    fake = fakes(context_length=64)
    # The engine believes in a larger context than the server has: the server refuses.
    async with running(SGLangEngine(fake.url, ServerOptions(max_context=4096))) as engine:
        with pytest.raises(ContextLengthExceeded) as info:
            await run(engine, list(range(3, 103)), SamplingParams(max_new_tokens=4), stream)
        assert (info.value.prompt_tokens, info.value.max_context) == (100, 64)
        with pytest.raises(ContextLengthExceeded):
            await run(engine, PROMPT, SamplingParams(max_new_tokens=60), stream)


async def test_server_errors_and_dead_servers_are_engine_errors(fakes):
    fake = fakes()
    fake.fail_status = 500
    async with running(SGLangEngine(fake.url)) as engine:
        with pytest.raises(EngineError, match="answered 500"):
            await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))
        assert not await engine.health()
    dead = f"http://127.0.0.1:{free_port()}"
    async with running(SGLangEngine(dead)) as engine:
        assert engine.max_context == 4096  # nobody answered: the fallback
        with pytest.raises(EngineError, match="cannot reach the SGLang server"):
            await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))
        assert not await engine.health()
    slow = fakes(token_delay_s=1.0)
    async with running(SGLangEngine(slow.url, ServerOptions(timeout_s=0.3))) as engine:
        with pytest.raises(EngineError, match="did not answer"):
            await engine.generate(PROMPT, SamplingParams(max_new_tokens=5))


def test_sglang_engine_needs_urls():
    from gateway.inference.registry import make_inference_engine

    with pytest.raises(ValueError, match="engine-url"):
        make_inference_engine(GatewayConfig(engine="sglang"))
    engine = make_inference_engine(
        GatewayConfig(engine="sglang", engine_urls=["a:1", "http://b:2/"])
    )
    assert isinstance(engine, SGLangEngine)
    assert engine.urls == ["http://a:1", "http://b:2"]


def test_serve_cli_requires_an_engine_url():
    import argparse

    from gateway.cli import add_serve_args, cmd_serve

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(["--engine", "sglang"])
    with pytest.raises(SystemExit, match="--engine-url"):
        cmd_serve(args)
    args = parser.parse_args(["--engine", "sglang", "--engine-url", "u1", "--engine-url", "u2"])
    assert args.engine_urls == ["u1", "u2"]


# ---- through the gateway -----------------------------------------------------------------
@pytest.fixture
def sglang_gateway(tmp_path, tokenizer, monkeypatch):
    """`make(fake) -> BackgroundGateway` serving with the sglang engine (built by the factory)."""
    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
    started: list[BackgroundGateway] = []

    def make(*fakes_: FakeSGLangServer, engine: SGLangEngine | None = None) -> BackgroundGateway:
        config = GatewayConfig(
            port=0,
            database=str(tmp_path / f"g{len(started)}.db"),
            admin_key=ADMIN_KEY,
            engine="sglang",
            engine_urls=[f.url for f in fakes_],
            request_timeout_s=30,
        )
        gw = BackgroundGateway(config, engine=engine).start()
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()


def chat(client: httpx.Client, gw: BackgroundGateway, key: str, **body: Any) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "What is 2 + 2?"}])
    return client.post(f"{gw.url}/chat/completions", headers=bearer(key), json=body)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completion_on_sglang_is_recorded(fakes, sglang_gateway, stream):
    fake = fakes(stop_after=4, eos_id=2)
    gw = sglang_gateway(fake)
    assert isinstance(gw.engine, SGLangEngine)
    session_id, key = create_session(gw.url)
    with http_client() as client:
        r = chat(client, gw, key, max_tokens=32, logprobs=True, stream=stream)
        assert r.status_code == 200, r.text
        if stream:
            first = next(line for line in r.text.splitlines() if line.startswith("data: {"))
            cid = json.loads(first.removeprefix("data: "))["id"]
        else:
            body = r.json()
            cid = body["id"]
            assert body["choices"][0]["finish_reason"] == "stop"
            served = [t["logprob"] for t in body["choices"][0]["logprobs"]["content"]]
    sent = fake.generate_bodies()[0]
    rec = completion_record(gw, session_id, cid)
    ids, lps = expected(sent["input_ids"], 4, 0)
    assert rec["prompt_ids"] == sent["input_ids"]  # what the engine saw, exactly
    assert rec["output_ids"] == ids + [2]
    # stored as float32
    assert rec["output_logprobs"] == pytest.approx(lps + [token_logprob(2, 4, 0)], abs=1e-6)
    assert rec["output_versions"] == [0] * 5
    assert rec["finish_reason"] == "stop"
    assert fake.routing_keys == [session_id]  # the session id routes
    assert sent["stream"] is stream
    if not stream:
        assert served == pytest.approx(lps + [token_logprob(2, 4, 0)], abs=1e-6)


def test_dead_sglang_is_503_and_the_gateway_keeps_serving(fakes, sglang_gateway):
    fake = fakes()
    gw = sglang_gateway(fake)
    base = gw.url.removesuffix("/v1")
    _, key = create_session(gw.url)
    with http_client() as client:
        fake.fail_status = 500
        err = assert_error_shape(chat(client, gw, key, max_tokens=4), 503)
        assert err["code"] == "engine_unavailable"
        assert "answered 500" in err["message"]
        assert client.get(f"{base}/healthz").status_code == 503
        fake.fail_status = None
        assert chat(client, gw, key, max_tokens=4).status_code == 200
        assert client.get(f"{base}/healthz").status_code == 200
        fake.stop()  # connection refused from now on
        err = assert_error_shape(chat(client, gw, key, max_tokens=4), 503)
        assert "cannot reach" in err["message"]
        listing = client.get(f"{gw.url}/sessions", headers=admin_headers()).json()
    assert listing["data"][0]["num_completions"] == 1  # only the answered request


def test_sglang_context_refusal_is_a_400(fakes, sglang_gateway):
    fake = fakes(context_length=64)
    # An engine that believes in a larger context than the server has.
    gw = sglang_gateway(fake, engine=SGLangEngine(fake.url, ServerOptions(max_context=4096)))
    _, key = create_session(gw.url)
    with http_client() as client:
        err = assert_error_shape(chat(client, gw, key, max_tokens=100), 400)
        assert err["code"] == "context_length_exceeded"
        assert "64 tokens" in err["message"]
        assert chat(client, gw, key, max_tokens=4).status_code == 200


def test_trainer_thread_updates_weights_through_the_gateway_engine(fakes, sglang_gateway):
    fake = fakes(stop_after=2)
    gw = sglang_gateway(fake)
    session_id, key = create_session(gw.url)
    # The trainer's own event loop, on another thread than the gateway's.
    assert asyncio.run(gw.engine.update_weights_from_disk("/ckpt/step-5", 5)) == 5
    with http_client() as client:
        cid = chat(client, gw, key, max_tokens=8).json()["id"]
        health = client.get(f"{gw.url.removesuffix('/v1')}/healthz").json()
    assert health["policy_version"] == 5
    rec = completion_record(gw, session_id, cid)
    assert rec["output_versions"] == [5] * len(rec["output_ids"])
    assert fake.weight_version == "5"


# ---- the embedded engine's async update_weights_from_disk ---------------------------------
async def test_embedded_engine_update_weights_from_disk(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gateway.inference.embedded import EmbeddedEngine

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(tmp_path / name)
    engine = EmbeddedEngine(tmp_path / "a")
    await engine.start()
    try:
        assert await engine.update_weights_from_disk(str(tmp_path / "b")) == 1
        assert await engine.update_weights_from_disk(str(tmp_path / "b"), version=9) == 9
        saved = LlamaForCausalLM.from_pretrained(tmp_path / "b").state_dict()
        for key, value in engine.model.state_dict().items():
            assert torch.equal(value, saved[key]), key
        result = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        assert result.versions == [9, 9]
    finally:
        await engine.close()


async def test_engines_without_disk_updates_say_so():
    from gateway.inference.fake import FakeEngine

    with pytest.raises(NotImplementedError, match="'fake' engine cannot load weights"):
        await FakeEngine([5], stop_id=2).update_weights_from_disk("/ckpt")


def test_engine_answers_with_non_finite_logprobs_and_big_ints_are_read():
    """A server that writes Python's `-Infinity` (a token the sampler could not pick) or
    an integer past 64 bits is read as the standard library reads it; bytes that are not
    JSON are an EngineError, not a crash."""
    from gateway.inference.base import EngineError

    parse_output = SGLangEngine("http://engine").parse_answer
    raw = b'{"text": "", "meta_info": {"output_token_logprobs": [[-Infinity, 5, null]], "x": 18446744073709551616}}'
    out = parse_output(raw, "http://engine")
    assert out["meta_info"]["output_token_logprobs"][0][0] == float("-inf")
    assert out["meta_info"]["x"] == 2**64
    with pytest.raises(EngineError, match="not JSON"):
        parse_output(b"<html>502</html>", "http://engine")
