"""Token-level workflows: RolloutEngine.agenerate, the ReMax example, TokenWorkflowRunner
(what a workflow may return, checked against its recorded generations), REINFORCE loss."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rollout_helpers import token_store

from gateway.inference.base import SamplingParams
from gateway.inference.fake import FAKE_LOGPROB, FakeEngine
from trainer.api import (
    GenerationHyperparameters,
    LLMRequest,
    RolloutWorkflow,
    import_file,
    load_config,
)
from trainer.rollout.engine import (
    ContextTooLongError,
    EmptyPromptError,
    GenerationError,
    RolloutEngine,
)
from trainer.rollout.token_episodes import TokenWorkflowRunner

REPO = Path(__file__).resolve().parent.parent
REMAX = import_file(REPO / "agents" / "remax.py")
STOP = 2
ROW = {
    "messages": [{"role": "user", "content": "Tom has 2 apples and gets 3 more."}],
    "answer": "5",
}


def fake(**kwargs) -> FakeEngine:
    kwargs.setdefault("reply_ids", [5, 6, 7])
    kwargs.setdefault("stop_id", STOP)
    return FakeEngine(**kwargs)


@pytest.fixture
def store(tmp_path):  # type: ignore[no-untyped-def]
    """The store token-level episodes record into (a real SQLite one)."""
    with token_store(tmp_path) as recorder:
        yield recorder


@pytest.fixture
def background_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop on its own thread, like the trainer's gateway thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


# ---- RolloutEngine -------------------------------------------------------------------


async def test_agenerate_returns_what_the_engine_made() -> None:
    eng = fake()
    rollout = RolloutEngine(eng)
    g = GenerationHyperparameters(max_new_tokens=8, temperature=0.7, top_p=0.9, seed=3)
    resp = await rollout.agenerate(LLMRequest(input_ids=[1, 9, 9], gconfig=g))
    assert resp.input_tokens == [1, 9, 9]
    assert resp.output_tokens == [5, 6, 7, STOP]
    assert resp.output_logprobs == [FAKE_LOGPROB] * 4
    assert resp.output_versions == [0] * 4
    assert resp.stop_reason == "stop"
    assert (resp.input_len, resp.output_len) == (3, 4)
    prompt, params = eng.calls[-1]
    assert prompt == [1, 9, 9]
    assert (params.max_new_tokens, params.temperature, params.top_p, params.seed) == (
        8,
        0.7,
        0.9,
        3,
    )

    eng.bump_version()
    assert rollout.version == 1
    resp = await rollout.agenerate(LLMRequest(input_ids=[1], gconfig=g.new(max_new_tokens=2)))
    assert resp.output_tokens == [5, 6] and resp.stop_reason == "length"
    assert resp.output_versions == [1, 1]
    assert rollout.num_requests == 2


async def test_greedy_and_default_stop_tokens() -> None:
    eng = fake()
    rollout = RolloutEngine(eng, default_stop_token_ids=[STOP, 11])
    g = GenerationHyperparameters(temperature=0.9)
    await rollout.agenerate(LLMRequest(input_ids=[1], gconfig=g.new(greedy=True)))
    params: SamplingParams = eng.calls[-1][1]
    assert params.temperature == 0.0 and params.stop_token_ids == [STOP, 11]
    await rollout.agenerate(LLMRequest(input_ids=[1], gconfig=g.new(stop_token_ids=[4])))
    assert eng.calls[-1][1].stop_token_ids == [4] and eng.calls[-1][1].temperature == 0.9
    assert g.new(temperature=0).is_greedy and g.new(greedy=True).behaviour_temperature == 1.0
    assert g.new(n_samples=4).n_samples == 4 and g.n_samples == 1  # new() copies
    with pytest.raises(TypeError, match="no field"):
        g.new(n=4)


async def test_agenerate_errors_are_clear() -> None:
    eng = fake(max_context=4)
    rollout = RolloutEngine(eng)
    with pytest.raises(EmptyPromptError, match="empty"):
        await rollout.agenerate(LLMRequest(input_ids=[]))
    with pytest.raises(ContextTooLongError, match="context of 4 tokens") as info:
        await rollout.agenerate(LLMRequest(input_ids=[1, 2, 3, 4]))
    assert info.value.prompt_tokens == 4 and info.value.max_context == 4
    eng.alive = False
    with pytest.raises(
        GenerationError, match="engine 'fake' failed: EngineError: fake engine is down"
    ):
        await rollout.agenerate(LLMRequest(input_ids=[1]))


class LoopRecordingEngine(FakeEngine):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.cancelled = threading.Event()

    async def generate(self, prompt_ids, params, **kwargs):  # type: ignore[no-untyped-def]
        self.loops.append(asyncio.get_running_loop())
        try:
            return await super().generate(prompt_ids, params, **kwargs)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def test_agenerate_runs_on_the_engines_loop(background_loop) -> None:
    eng = LoopRecordingEngine(reply_ids=[5, 6], stop_id=STOP, delay_s=0.01)
    rollout = RolloutEngine(eng, loop=background_loop)
    resps = await asyncio.gather(
        *(rollout.agenerate(LLMRequest(input_ids=[1, 2])) for _ in range(4))
    )
    assert all(r.output_tokens == [5, 6, STOP] for r in resps)
    assert eng.loops == [background_loop] * 4
    assert asyncio.get_running_loop() is not background_loop

    # a caller that gives up cancels the generation on the engine's loop as well
    eng.delay_s = 30
    task = asyncio.ensure_future(rollout.agenerate(LLMRequest(input_ids=[1])))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(eng.cancelled.wait, 5)


async def test_agenerate_with_the_real_engine_across_loops(background_loop, tokenizer) -> None:
    from gateway.inference.embedded import EmbeddedEngine

    engine = EmbeddedEngine(None, device="cpu", max_batch_size=4)
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(engine.start(), background_loop))
    try:
        rollout = RolloutEngine(engine, loop=background_loop)
        g = GenerationHyperparameters(max_new_tokens=4, greedy=True, stop_token_ids=[STOP])
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 2 + 3?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        prompt = tokenizer.encode(prompt, add_special_tokens=False)
        resp = await rollout.agenerate(LLMRequest(input_ids=prompt, gconfig=g))
        direct = await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(
                engine.generate(prompt, g.to_sampling_params()), background_loop
            )
        )
        assert 1 <= resp.output_len <= 4
        assert resp.output_tokens == direct.output_ids
        assert resp.output_versions == direct.versions == [0] * resp.output_len
        assert resp.output_logprobs == pytest.approx(direct.logprobs, abs=1e-4)
        assert all(lp <= 0 and math.isfinite(lp) for lp in resp.output_logprobs)
    finally:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(engine.close(), background_loop))


# ---- the ReMax workflow --------------------------------------------------------------


class GreedyScriptEngine(FakeEngine):
    """Answers `greedy_text` to greedy requests and `sampled_text` to the others."""

    def __init__(self, tokenizer, sampled_text: str, greedy_text: str) -> None:
        super().__init__(
            reply_ids=[],
            stop_id=STOP,
            encode=lambda t: tokenizer.encode(t, add_special_tokens=False),
        )
        self.texts = (sampled_text, greedy_text)

    async def generate(self, prompt_ids, params, **kwargs):  # type: ignore[no-untyped-def]
        self.script(self.texts[1] if params.temperature == 0 else self.texts[0])
        return await super().generate(prompt_ids, params, **kwargs)


async def test_remax_workflow_output(tokenizer) -> None:
    eng = GreedyScriptEngine(tokenizer, "2 + 3 = 5. The answer is 5.", "The answer is 6.")
    eng.bump_version()
    wf = REMAX.ReMaxRLVRWorkflow(
        gconfig={"max_new_tokens": 32, "temperature": 0.7}, tokenizer=tokenizer
    )
    out = await wf.arun_episode(RolloutEngine(eng), dict(ROW))

    (_, sampled), (_, greedy) = sorted(eng.calls, key=lambda c: c[1].temperature, reverse=True)
    assert sampled.temperature == 0.7 and greedy.temperature == 0.0
    assert STOP in sampled.stop_token_ids
    prompt = tokenizer.apply_chat_template(
        ROW["messages"], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    reply = tokenizer.encode("2 + 3 = 5. The answer is 5.", add_special_tokens=False) + [STOP]
    n_in, n_out = len(prompt_ids), len(reply)
    total = n_in + n_out

    for key in ("input_ids", "loss_mask", "versions", "logprobs", "attention_mask", "rewards"):
        assert out[key].shape == (1, total), key
    assert out["input_ids"][0].tolist() == prompt_ids + reply
    assert out["loss_mask"][0].tolist() == [0] * n_in + [1] * n_out
    assert out["versions"][0].tolist() == [-1] * n_in + [1] * n_out
    assert out["logprobs"][0].tolist() == [0.0] * n_in + [FAKE_LOGPROB] * n_out
    assert bool(out["attention_mask"].all())
    # sampled is right (1.0), greedy wrong (0.0): +1.0 on every token
    assert out["rewards"][0].tolist() == [1.0] * total

    eng.texts = ("I do not know.", "The answer is 5.")
    out = await wf.arun_episode(RolloutEngine(eng), dict(ROW))
    assert set(out["rewards"][0].tolist()) == {-1.0}


async def test_runner_turns_remax_episodes_into_samples(tokenizer, store) -> None:
    eng = GreedyScriptEngine(tokenizer, "The answer is 5.", "The answer is 5.")
    wf = REMAX.ReMaxRLVRWorkflow(
        gconfig={"max_new_tokens": 32, "temperature": 0.7}, tokenizer=tokenizer
    )
    runner = TokenWorkflowRunner(wf, RolloutEngine(eng, recorder=store))
    episodes = await runner.run_group(dict(ROW), 3, 2)
    assert len(episodes) == 2 and {ep.group for ep in episodes} == {3}
    for ep in episodes:
        assert ep.error is None and ep.num_completions == 2 and ep.reward == 0.0
        (s,) = ep.samples  # the greedy baseline is recorded, not trained
        (raw,) = ep.raw
        n = len(s["input_ids"])
        # the two answers have the same tokens: the sampled one (the gconfig's
        # temperature) is the one trained
        assert s["returns"] == 0.0 and s["temperature"] == 0.7
        assert len(s["loss_mask"]) == len(s["logprobs"]) == len(s["versions"]) == n
        assert s["versions"] == [0 if m else -1 for m in s["loss_mask"]]
        assert raw["input_ids"].shape == (n,) and raw["rewards"].shape == (n,)
        assert raw["input_ids"].tolist() == s["input_ids"]
        stored = {c["id"]: c for c in store.repo.completions(ep.session_id)}
        (trained,) = s["completion_ids"]
        assert stored[trained]["request"]["temperature"] == 0.7
        assert [c["side_request"] for c in stored.values()].count(True) == 1
    assert episodes[0].session_id != episodes[1].session_id


# ---- TokenWorkflowRunner: what workflows may return ----------------------------------


PROMPT = [1, 2]
REPLY = [5, 6, 7, STOP]  # what fake() answers


class Returns(RolloutWorkflow):
    """Generates once from PROMPT, then returns `value(response)` (or raises `exc`)."""

    def __init__(self, value=None, exc: Exception | None = None) -> None:  # type: ignore[no-untyped-def]
        self.value, self.exc = value, exc

    async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
        resp = await engine.agenerate(LLMRequest(input_ids=PROMPT))
        if self.exc is not None:
            raise self.exc
        return self.value(resp) if callable(self.value) else self.value


def good(**changes):  # type: ignore[no-untyped-def]
    """The usual return value: prompt + reply, the reply trained, reward 0.5."""
    out = {
        "input_ids": torch.tensor([PROMPT + REPLY]),
        "loss_mask": torch.tensor([[0, 0, 1, 1, 1, 1]]),
        "logprobs": torch.tensor([[0.0, 0.0] + [FAKE_LOGPROB] * 4]),
        "versions": torch.tensor([[-1, -1, 0, 0, 0, 0]]),
        "rewards": torch.tensor([0.5]),
    }
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


async def run_one(workflow: RolloutWorkflow, store, version: int = 0, **kwargs):  # type: ignore[no-untyped-def]
    eng = fake()
    for _ in range(version):
        eng.bump_version()
    runner = TokenWorkflowRunner(workflow, RolloutEngine(eng, recorder=store), **kwargs)
    (ep,) = await runner.run_group({"x": 1}, 0, 1)
    return ep


async def test_a_good_episode_and_its_sample(store) -> None:
    ep = await run_one(Returns(good()), store, version=4)
    assert ep.error is None and ep.reward == 0.5 and ep.num_completions == 1
    (s,) = ep.samples
    (c,) = store.repo.completions(ep.session_id)
    assert c["reward"] == 0.5 and not c["side_request"] and c["endpoint"] == "direct"
    assert {k: s[k] for k in ("input_ids", "loss_mask", "versions", "returns", "temperature")} == {
        "input_ids": PROMPT + REPLY,
        "loss_mask": [0, 0, 1, 1, 1, 1],
        "versions": [-1, -1, 4, 4, 4, 4],  # the recorded versions, whatever was returned
        "returns": 0.5,
        "temperature": 1.0,
    }
    assert s["logprobs"] == pytest.approx([0.0, 0.0] + [FAKE_LOGPROB] * 4)
    assert s["completion_ids"] == [c["id"]] and s["session_id"] == ep.session_id


def two(first, second):  # type: ignore[no-untyped-def]
    return torch.tensor([first, second])


@pytest.mark.parametrize(
    ("workflow", "message"),
    [
        (Returns(exc=RuntimeError("boom")), "RuntimeError: boom"),
        (Returns(good(loss_mask=None)), "no 'loss_mask'"),
        (Returns(good(input_ids=None)), "no 'input_ids'"),
        (Returns(good(rewards=None)), "no 'rewards'"),
        (
            Returns(good(loss_mask=torch.tensor([[0, 1, 1]]))),
            "loss_mask has 3 entries but input_ids has 6",
        ),
        (Returns(good(logprobs=torch.tensor([[0.0, -1.0]]))), "logprobs has 2 entries"),
        (Returns(good(rewards=torch.tensor([float("nan")]))), "rewards is nan"),
        (Returns(good(rewards=torch.tensor([[0.0] * 5 + [float("inf")]]))), "NaN or inf"),
        (Returns(good(rewards=torch.tensor([1.0, 2.0]))), "one value per token"),
        (Returns(good(loss_mask=torch.tensor([[0] * 6]))), "no token to train on"),
        (Returns(good(loss_mask=torch.tensor([[0, 0, 2, 1, 1, 1]]))), "only 0 and 1"),
        (Returns(good(input_ids=torch.tensor([[1.0] * 6]))), "must be integers"),
        (Returns([1, 2, 3]), "expected a dict of tensors"),
        # trained tokens must be whole outputs the engine gave, after their own prompt
        (Returns(good(input_ids=torch.tensor([PROMPT + [5, 6, 7, 9]]))), "tokens 2..5 are not"),
        (Returns(good(input_ids=torch.tensor([[3, 2, *REPLY]]))), "tokens 2..5 are not"),
        (Returns(good(loss_mask=torch.tensor([[0, 0, 1, 1, 1, 0]]))), "tokens 2..4 are not"),
        (Returns(good(loss_mask=torch.tensor([[0, 1, 1, 1, 1, 1]]))), "tokens 1..5 are not"),
        (
            Returns(
                lambda r: {
                    "input_ids": two(PROMPT + REPLY, PROMPT + REPLY),
                    "loss_mask": two([0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]),
                    "rewards": torch.tensor([1.0, 0.0]),
                }
            ),  # fmt: skip
            "sequences 0 and 1 end with the same generation",
        ),
    ],
)
async def test_bad_workflows_become_episode_errors(workflow, message, store) -> None:  # type: ignore[no-untyped-def]
    ep = await run_one(workflow, store)
    assert ep.error is not None and message in ep.error, ep.error
    assert ep.samples == [] and ep.raw == []
    # what it generated is in the store all the same, with no reward
    (c,) = store.repo.completions(ep.session_id)
    assert c["output_ids"] == REPLY and c["reward"] is None


async def test_none_discards_the_episode(store) -> None:
    ep = await run_one(Returns(None), store)
    assert ep.error is None and ep.samples == [] and ep.reward is None
    assert [c["reward"] for c in store.repo.completions(ep.session_id)] == [None]


async def test_optional_keys_and_shapes(store) -> None:
    # 1-D tensors, plain lists, a float reward, no logprobs and no versions
    ep = await run_one(
        Returns({"input_ids": PROMPT + REPLY, "loss_mask": torch.tensor([0, 0, 1, 1, 1, 1]),
                 "rewards": 2.0}),
        store, version=7,
    )  # fmt: skip
    (s,) = ep.samples
    assert s["logprobs"] == [0.0, 0.0] + [FAKE_LOGPROB] * 4  # as recorded
    assert s["versions"] == [-1, -1, 7, 7, 7, 7]
    assert s["returns"] == 2.0

    # per-token rewards: the value at the last trained token
    rewards = torch.tensor([[9.0, 9.0, 0.0, 0.0, 0.25, 0.75]])
    ep = await run_one(Returns(good(rewards=rewards, extra="note")), store)
    assert ep.samples[0]["returns"] == 0.75 and ep.raw[0]["extra"] == "note"


class GeneratesTwice(RolloutWorkflow):
    """Two prompts, two generations, returned as one right-padded batch."""

    async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
        g = GenerationHyperparameters(max_new_tokens=1)
        await engine.agenerate(LLMRequest(input_ids=[1, 2], gconfig=g.new(max_new_tokens=4)))
        await engine.agenerate(LLMRequest(input_ids=[7, 8], gconfig=g))
        return {
            "input_ids": torch.tensor([[1, 2, 5, 6, 7, STOP], [7, 8, 5, 0, 0, 0]]),
            "loss_mask": torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0]]),
            "attention_mask": torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]]),
            "rewards": torch.tensor([1.0, 0.0]),
            "tag": ["a", "b"],
        }


async def test_padded_batch_of_two_sequences(store) -> None:
    ep = await run_one(GeneratesTwice(), store)
    assert ep.error is None, ep.error
    assert [s["input_ids"] for s in ep.samples] == [[1, 2, 5, 6, 7, STOP], [7, 8, 5]]
    assert [s["returns"] for s in ep.samples] == [1.0, 0.0]
    assert ep.raw[1]["loss_mask"].tolist() == [0, 0, 1] and ep.raw[1]["tag"] == "b"
    assert ep.raw[1]["rewards"].shape == ()
    assert ep.reward == 0.5


class FakeTensorDict:
    """Quacks like tensordict.TensorDict (which is not installed)."""

    def __init__(self, data, batch_size) -> None:  # type: ignore[no-untyped-def]
        self._data, self.batch_size = data, torch.Size(batch_size)

    def items(self):  # type: ignore[no-untyped-def]
        return self._data.items()


async def test_tensordict_like_and_rewards_without_batch_dim(store) -> None:
    # as in the reference ReMax: rewards is (L,) while the rest is (1, L)
    data = good(rewards=torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0, -1.0]))
    ep = await run_one(Returns(FakeTensorDict(data, [1])), store)
    assert ep.error is None and ep.samples[0]["returns"] == -1.0
    assert ep.raw[0]["rewards"].shape == (6,) and ep.samples[0]["input_ids"] == PROMPT + REPLY


class SampledAndGreedy(RolloutWorkflow):
    """Two answers with the same tokens, sampled at 0.6 and greedy; returns one."""

    gconfig = GenerationHyperparameters(temperature=0.6)

    async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
        for g in (self.gconfig, self.gconfig.new(greedy=True)):
            resp = await engine.agenerate(LLMRequest(input_ids=PROMPT, gconfig=g))
        return good() | {"input_ids": torch.tensor([PROMPT + resp.output_tokens])}


async def test_the_trained_generation_is_told_by_the_workflows_temperature(store) -> None:
    wf = SampledAndGreedy()
    (s,) = (await run_one(wf, store)).samples
    assert s["temperature"] == 0.6
    wf.gconfig = GenerationHyperparameters(temperature=0.6, greedy=True)
    (s,) = (await run_one(wf, store)).samples
    assert s["temperature"] == 1.0  # greedy: logprobs of the raw logits


@pytest.mark.parametrize("style", ["individual", "concat"])
async def test_export_style_and_turn_discount_apply(store, style) -> None:
    class TwoTurns(RolloutWorkflow):
        async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
            first = await engine.agenerate(LLMRequest(input_ids=PROMPT))
            ids = PROMPT + first.output_tokens + [9]
            second = await engine.agenerate(LLMRequest(input_ids=ids))
            n = len(second.output_tokens)
            return {
                "input_ids": ids + second.output_tokens,
                "loss_mask": [0, 0, 1, 1, 1, 1, 0] + [1] * n,
                "rewards": 1.0,
            }

    ep = await run_one(TwoTurns(), store, export_style=style, turn_discount=0.5)
    first, second = store.repo.completions(ep.session_id)
    assert second["parent_id"] == first["id"] and second["reward"] == 1.0
    if style == "individual":
        assert [(s["completion_ids"], s["returns"]) for s in ep.samples] == [
            ([first["id"]], 0.5),
            ([second["id"]], 1.0),
        ]
    else:
        (s,) = ep.samples
        assert s["completion_ids"] == [first["id"], second["id"]]
        assert s["input_ids"] == PROMPT + REPLY + [9] + REPLY
        assert s["token_returns"] == [0.0, 0.0] + [0.5] * 4 + [0.0] + [1.0] * 4


# ---- the REINFORCE loss on packed tensors ---------------------------------------------


def test_reinforce_loss_matches_a_hand_computation() -> None:
    torch.manual_seed(0)
    # two sequences packed: A = [a0 a1 a2], B = [b0 b1]. Every token is marked trainable
    # (even the first ones) so a wrong roll or a missing sequence boundary would show.
    input_ids = torch.tensor([3, 1, 4, 0, 2])
    loss_mask = torch.tensor([1, 1, 1, 1, 1])
    rewards = torch.tensor([10.0, 1.0, 2.0, 20.0, 3.0])  # reward of each token
    cu_seqlens = torch.tensor([0, 3, 5], dtype=torch.int32)
    logits = torch.randn(5, 6, requires_grad=True)
    data = {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "rewards": rewards,
        "cu_seqlens": cu_seqlens,
    }
    loss = REMAX.reinforce_loss_fn(logits, data)

    lp = torch.log_softmax(logits.detach(), dim=-1)
    # position t predicts token t+1 of the same sequence: a1 <- 0, a2 <- 1, b1 <- 3
    expected = -(lp[0, 1] * 1.0 + lp[1, 4] * 2.0 + lp[3, 2] * 3.0) / 3
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    loss.backward()
    assert logits.grad is not None
    assert torch.count_nonzero(logits.grad[2]) == 0 and torch.count_nonzero(logits.grad[4]) == 0

    # the usual case: prompts masked
    data["loss_mask"] = torch.tensor([0, 1, 1, 0, 1])
    loss = REMAX.reinforce_loss_fn(logits.detach(), data)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_reinforce_actor_calls_train_batch_with_the_contract() -> None:
    calls = []

    class Engine:
        def train_batch(self, data, loss_fn, loss_weight_fn):  # type: ignore[no-untyped-def]
            calls.append((data, loss_fn, loss_weight_fn))
            return {"loss": 0.0}

    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    assert REMAX.ReinforceActor(Engine()).train_reinforce(batch) == {"loss": 0.0}
    data, loss_fn, weight_fn = calls[0]
    assert data is batch and loss_fn is REMAX.reinforce_loss_fn
    assert int(weight_fn({"loss_mask": torch.tensor([0, 1, 1, 0, 1])})) == 3
    assert issubclass(REMAX.DeepSpeedReinforceActor, REMAX.DeepSpeedEngine)
    assert callable(REMAX.DeepSpeedReinforceActor.train_reinforce)


def test_remax_yaml_loads() -> None:
    cfg = load_config(REPO / "agents" / "remax.yaml")
    assert cfg.workflow == "agents/remax.py:ReMaxRLVRWorkflow"
    assert cfg.rollout.group_size == 1
    assert cfg.train.engine_class == "agents/remax.py:DeepSpeedReinforceActor"
    assert cfg.train.step_method == "train_reinforce"
    assert cfg.total_steps <= 10
    assert "gconfig" in cfg.workflow_kwargs


async def test_twins_each_go_to_the_sequence_they_fit(store) -> None:
    """Two answers with the same tokens; a second turn continues one of them. The
    single-turn sequence ends on the twin without a child, so neither is lost."""

    class Twins(RolloutWorkflow):
        async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
            for _ in range(2):
                await engine.agenerate(LLMRequest(input_ids=PROMPT))
            ids = PROMPT + REPLY + [9]
            second = await engine.agenerate(LLMRequest(input_ids=ids))
            n = len(second.output_tokens)
            return {
                "input_ids": two(PROMPT + REPLY + [0] * (1 + n), ids + second.output_tokens),
                "loss_mask": two(
                    [0, 0, 1, 1, 1, 1] + [0] * (1 + n), [0, 0, 1, 1, 1, 1, 0] + [1] * n
                ),
                "attention_mask": two([1] * 6 + [0] * (1 + n), [1] * (7 + n)),
                "rewards": torch.tensor([1.0, 0.5]),
            }

    ep = await run_one(Twins(), store, export_style="concat")
    assert ep.error is None, ep.error
    first, twin, second = store.repo.completions(ep.session_id)
    assert second["parent_id"] == first["id"]
    assert (first["reward"], twin["reward"], second["reward"]) == (None, 1.0, 0.5)
    assert [s["completion_ids"] for s in ep.samples] == [[twin["id"]], [first["id"], second["id"]]]
