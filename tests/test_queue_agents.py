"""Queue-based agents: registries, the obs/act driver, the multi-turn math agent, the math env."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path

import pytest
from rollout_helpers import token_store

from gateway.inference.fake import FAKE_LOGPROB, FakeEngine
from trainer.api import (
    Agent,
    BundledGenerationOutputs,
    EnvironmentService,
    GenerationHyperparameters,
    import_file,
    load_config,
    register_agent,
    register_env,
    registry,
)
from trainer.api.registry import RegistryError, make_agent, make_env
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.queue_agents import QueueAgentRunner

REPO = Path(__file__).resolve().parent.parent
AGENT_FILE = REPO / "agents" / "math_multi_turn_queue.py"
# the example task's environment (registers "math-single-step")
MathSingleStepEnv = import_file(REPO / "agents" / "math_task.py").MathSingleStepEnv
MATH_AGENT = import_file(AGENT_FILE)
STOP = 2
ROW = {
    "messages": [{"role": "user", "content": "Tom has 2 apples and gets 3 more."}],
    "answer": "5",
}
RETRY = "Unfortunately your answer is wrong. Let's try again."


@pytest.fixture
def store(tmp_path):  # type: ignore[no-untyped-def]
    """The store queue-agent episodes record into (a real SQLite one)."""
    with token_store(tmp_path) as recorder:
        yield recorder


def runner(agent, env, eng, store, style: str = "concat", **kwargs) -> QueueAgentRunner:  # type: ignore[no-untyped-def]
    """As the trainer builds it; `concat` (the example's config) trains each trajectory
    as the one sequence it returned."""
    engine = eng if isinstance(eng, RolloutEngine) else RolloutEngine(eng, recorder=store)
    return QueueAgentRunner(agent, env, engine, export_style=style, **kwargs)


@pytest.fixture
def registries(monkeypatch):  # type: ignore[no-untyped-def]
    """Registrations made by a test disappear after it."""
    monkeypatch.setattr(registry, "_AGENTS", copy.copy(registry._AGENTS))
    monkeypatch.setattr(registry, "_ENVS", copy.copy(registry._ENVS))


class VersionedFake(FakeEngine):
    """A fake engine whose policy version goes up after every completion."""

    async def generate(self, prompt_ids, params, **kwargs):  # type: ignore[no-untyped-def]
        result = await super().generate(prompt_ids, params, **kwargs)
        self.bump_version()
        return result


def text_engine(tokenizer, cls=FakeEngine, **kwargs) -> FakeEngine:  # type: ignore[no-untyped-def]
    return cls(
        reply_ids=tokenizer.encode("I am not sure.", add_special_tokens=False),
        stop_id=STOP,
        encode=lambda t: tokenizer.encode(t, add_special_tokens=False),
        **kwargs,
    )


def encode(tokenizer, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return tokenizer.encode(text, add_special_tokens=False)


def math_agent(tokenizer, **kwargs):  # type: ignore[no-untyped-def]
    kwargs.setdefault("gconfig", {"max_new_tokens": 32, "temperature": 0.7})
    return make_agent("math-multi-turn", tokenizer=tokenizer, **kwargs)


def other_tasks() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


# ---- registries ----------------------------------------------------------------------


class EchoAgent(Agent):
    def __init__(self, k: int = 0) -> None:
        self.k = k

    async def collect_trajectory(self, prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        return []


class OtherAgent(EchoAgent):
    pass


def test_registry(registries) -> None:  # type: ignore[no-untyped-def]
    register_agent("echo", EchoAgent)
    assert make_agent("echo", k=3).k == 3
    register_agent("echo", EchoAgent)  # the same class again (a file imported twice) is fine
    with pytest.raises(RegistryError, match="already registered to .*EchoAgent"):
        register_agent("echo", OtherAgent)
    with pytest.raises(RegistryError, match=r"unknown agent 'nope'; registered agents: \[.*'echo'"):
        make_agent("nope")
    with pytest.raises(RegistryError, match="cannot build agent 'echo'"):
        make_agent("echo", bogus=1)
    with pytest.raises(
        RegistryError, match=r"unknown env 'nope'; registered envs: \[.*'math-single-step'"
    ):
        make_env("nope")
    register_env("my-env", MathSingleStepEnv)
    with pytest.raises(RegistryError, match="already registered"):
        register_env("math-single-step", EchoEnv)
    assert "math-multi-turn" in registry._AGENTS
    assert isinstance(make_env("math-single-step"), MathSingleStepEnv)


def test_importing_the_agent_file_twice_registers_once() -> None:
    assert import_file(AGENT_FILE) is MATH_AGENT
    assert registry._AGENTS["math-multi-turn"] is MATH_AGENT.MathMultiTurnQueueAgent
    with pytest.raises(ValueError, match="does not exist"):
        import_file(REPO / "agents" / "missing.py")


# ---- the math environment ------------------------------------------------------------


class EchoEnv(EnvironmentService):
    async def step(self, action):  # type: ignore[no-untyped-def]
        return None, 0.0, True, False, {}


async def test_math_single_step_env() -> None:
    env = make_env("math-single-step")
    assert await env.reset(options={"qid": "q1", "answer": "5"}) == (None, {})
    result = await env.step(("q1@3", ["2 + 3 = 5. The answer is 5.", "The answer is 4.", ""]))
    assert result == (None, [1.0, 0.0, 0.0], True, False, {})
    assert (await env.step(("anything", ["It is 12"], "12")))[1] == [1.0]
    with pytest.raises(ValueError, match="no reference answer for qid 'q2'"):
        await env.step(("q2", ["5"]))
    assert (await MathSingleStepEnv(answers={"q9": "7"}).step(("q9", "7")))[1] == [1.0]


# ---- the multi-turn agent through the driver -----------------------------------------


async def test_two_turns_wrong_then_right(tokenizer, store) -> None:
    eng = text_engine(tokenizer, VersionedFake)
    eng.script("The answer is 4.", "2 + 3 = 5. The answer is 5.")
    (ep,) = await runner(math_agent(tokenizer), make_env("math-single-step"), eng, store).run_group(
        dict(ROW), 7, 1
    )
    assert ep.error is None and ep.group == 7 and ep.num_completions == 2
    (s,) = ep.samples

    prompt = encode(
        tokenizer,
        tokenizer.apply_chat_template(ROW["messages"], tokenize=False, add_generation_prompt=True),
    )
    out1 = encode(tokenizer, "The answer is 4.") + [STOP]
    feedback = encode(tokenizer, f"\n<|im_start|>user\n{RETRY}<|im_end|>\n<|im_start|>assistant\n")
    out2 = encode(tokenizer, "2 + 3 = 5. The answer is 5.") + [STOP]
    assert s["input_ids"] == prompt + out1 + feedback + out2
    assert s["loss_mask"] == [0] * len(prompt) + [1] * len(out1) + [0] * len(feedback) + [1] * len(
        out2
    )
    assert s["logprobs"] == [0.0] * len(prompt) + [FAKE_LOGPROB] * len(out1) + [0.0] * len(
        feedback
    ) + [FAKE_LOGPROB] * len(out2)
    assert s["versions"] == [-1] * len(prompt) + [0] * len(out1) + [-1] * len(feedback) + [1] * len(
        out2
    )
    assert s["returns"] == 0.5 and ep.reward == 0.5  # right on turn 2: turn_penalty ** 1
    assert s["temperature"] == 0.7
    # the second turn saw exactly the tokens it is trained on
    assert eng.calls[1][0] == prompt + out1 + feedback
    assert ep.raw[0]["num_turns"] == 2
    # nothing but the feedback turn in between: no second system prompt
    assert "SmolLM" not in tokenizer.decode(feedback)


async def test_wrong_twice_scores_zero_and_right_at_once_scores_one(tokenizer, store) -> None:
    eng = text_engine(tokenizer)
    eng.script("The answer is 4.", "The answer is 6.", "The answer is 5.")
    run = runner(math_agent(tokenizer), make_env("math-single-step"), eng, store)
    wrong = await run.run_episode(dict(ROW), 0)
    right = await run.run_episode(dict(ROW), 0)
    assert [s["returns"] for s in wrong.samples + right.samples] == [0.0, 1.0]
    assert right.num_completions == 1


async def test_n_samples_trajectories_form_one_group(tokenizer, store) -> None:
    eng = text_engine(tokenizer)
    # turn 1: three samples of the prompt; turn 2: the two wrong ones try again
    eng.script("The answer is 5.", "The answer is 4.", "The answer is 3.", "So 5.", "Still 4.")
    agent = math_agent(tokenizer, gconfig={"n_samples": 3, "max_new_tokens": 32, "seed": 10})
    (ep,) = await runner(agent, make_env("math-single-step"), eng, store).run_group(dict(ROW), 2, 1)
    assert ep.error is None and ep.num_completions == 5
    assert [s["returns"] for s in ep.samples] == [1.0, 0.5, 0.0]
    assert ep.reward == pytest.approx(0.5)
    assert len({s["session_id"] for s in ep.samples}) == 1
    # n samples of one observation get distinct seeds
    assert [p.seed for _, p in eng.calls[:3]] == [10, 11, 12]
    assert all(p.temperature == 1.0 for _, p in eng.calls)
    first = encode(tokenizer, "The answer is 5.") + [STOP]
    assert ep.samples[0]["input_ids"][-len(first) :] == first


async def test_output_cut_by_length_gets_its_turn_closed(tokenizer, store) -> None:
    eng = text_engine(tokenizer)
    long_answer = "Let me think about this problem step by step, slowly and carefully."
    eng.script(long_answer, "The answer is 5.")
    agent = math_agent(tokenizer, gconfig={"max_new_tokens": 4})
    (ep,) = await runner(agent, make_env("math-single-step"), eng, store).run_group(dict(ROW), 0, 1)
    s = ep.samples[0]
    cut = encode(tokenizer, long_answer)[:4]
    start = s["input_ids"].index(cut[0], len(s["input_ids"]) - 40)
    # the cut answer, then an end token that the model did not generate (masked)
    assert s["input_ids"][start : start + 5] == cut + [STOP]
    assert s["loss_mask"][start : start + 5] == [1, 1, 1, 1, 0]


# ---- the driver: errors and clean shutdown -------------------------------------------


class ScriptedAgent(Agent):
    def __init__(self, body) -> None:  # type: ignore[no-untyped-def]
        self.body = body

    async def collect_trajectory(self, prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        return await self.body(prompt, env, obs_queue, act_queue)


async def test_bundled_outputs_from_the_driver(store) -> None:
    seen: list[BundledGenerationOutputs] = []

    async def body(prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        await obs_queue.put(
            (prompt["qid"], [1, 2, 3], GenerationHyperparameters(n_samples=2, max_new_tokens=2))
        )
        act = await act_queue.get()
        seen.append(act)
        return [
            {
                "input_ids": act.seqs[i],
                "loss_mask": [0, 0, 0, 1, 1],
                "logprobs": [0.0] * 3 + act.logprobs[i],
                "versions": [-1] * 3 + act.versions[i],
                "reward": float(i),
            }
            for i in range(act.n)
        ]

    eng = FakeEngine(reply_ids=[5, 6, 7], stop_id=STOP)
    (ep,) = await runner(ScriptedAgent(body), EchoEnv(), eng, store).run_group({"a": 1}, 0, 1)
    (act,) = seen
    assert act.qid and act.qid != ep.session_id
    assert act.prompt_ids == [1, 2, 3] and act.output_ids == [[5, 6], [5, 6]]
    assert act.no_eos == [True, True] and act.finish_reasons == ["length", "length"]
    assert act.seqs == [[1, 2, 3, 5, 6]] * 2 and act.version_start == [0, 0]
    assert [s["returns"] for s in ep.samples] == [0.0, 1.0]


async def test_agent_that_raises_leaves_nothing_running(store) -> None:
    before = other_tasks()

    async def body(prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        await obs_queue.put((prompt["qid"], [1, 2], GenerationHyperparameters(n_samples=3)))
        await asyncio.sleep(0.02)  # the generations are in flight now
        raise ValueError("agent bug")

    eng = FakeEngine(reply_ids=[5], stop_id=STOP, delay_s=30)
    started = time.perf_counter()
    (ep,) = await runner(ScriptedAgent(body), EchoEnv(), eng, store).run_group({}, 0, 1)
    assert time.perf_counter() - started < 5
    assert ep.error == "ValueError: agent bug" and ep.samples == []
    assert ep.num_completions == 3
    await asyncio.sleep(0)
    assert other_tasks() == before


async def test_generation_failure_stops_the_waiting_agent(store) -> None:
    before = other_tasks()

    async def body(prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        await obs_queue.put((prompt["qid"], [1, 2], GenerationHyperparameters()))
        await act_queue.get()  # never answered
        return []

    eng = FakeEngine(reply_ids=[5], stop_id=STOP, max_context=2)  # the prompt does not fit
    (ep,) = await runner(ScriptedAgent(body), EchoEnv(), eng, store).run_group({}, 0, 1)
    assert ep.error is not None and ep.error.startswith("ContextTooLongError")
    await asyncio.sleep(0)
    assert other_tasks() == before


@pytest.mark.parametrize(
    ("trajectories", "message"),
    [
        ([{"input_ids": [1, 2], "loss_mask": [0], "reward": 1.0}], "loss_mask has 1 entries"),
        ([{"input_ids": [1, 2], "loss_mask": [0, 1], "reward": float("nan")}], "reward is nan"),
        ([{"input_ids": [1, 2], "loss_mask": [0, 1]}], "no 'rewards' (or 'reward')"),
        ("oops", "must return a list of trajectory dicts"),
    ],
)
async def test_malformed_trajectories(trajectories, message, store) -> None:  # type: ignore[no-untyped-def]
    async def body(prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        return trajectories

    eng = FakeEngine(reply_ids=[5], stop_id=STOP)
    (ep,) = await runner(ScriptedAgent(body), EchoEnv(), eng, store).run_group({}, 0, 1)
    assert ep.error is not None and message in ep.error


async def test_bad_observation_and_timeout(store) -> None:
    async def bad(prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        await obs_queue.put(("q", "not tokens", GenerationHyperparameters()))
        return await act_queue.get()

    async def stuck(prompt, env, obs_queue, act_queue):  # type: ignore[no-untyped-def]
        return await act_queue.get()  # forgot to put an observation

    eng = RolloutEngine(FakeEngine(reply_ids=[5], stop_id=STOP), recorder=store)
    (ep,) = await runner(ScriptedAgent(bad), EchoEnv(), eng, store).run_group({}, 0, 1)
    assert "token_ids must be a list of ints" in ep.error
    timed = runner(ScriptedAgent(stuck), EchoEnv(), eng, store, episode_timeout_s=0.05)
    (ep,) = await timed.run_group({}, 0, 1)
    assert ep.error.startswith("TimeoutError")


def test_queue_yaml_loads() -> None:
    cfg = load_config(REPO / "agents" / "math_multi_turn_queue.yaml")
    assert cfg.imports == ["agents/math_multi_turn_queue.py"]
    assert cfg.agent["name"] == "math-multi-turn" and cfg.env == {
        "name": "math-single-step",
        "args": {},
    }
    assert cfg.total_steps <= 10
    assert cfg.rollout.agent.export_style == "concat"  # a trajectory is one sample
    agent_args = dict(cfg.agent["args"])
    assert GenerationHyperparameters.coerce(agent_args["gconfig"]).n_samples >= 2
