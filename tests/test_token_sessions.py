"""One way to build samples: token-level workflows and queue agents train on their store.

Through a real gateway (its store, REST API and /ui; an instant fake engine answering in
real token ids), a ReMax workflow and the multi-turn queue agent run as the trainer runs
them. Their generations are in the store with parent links and rewards, the samples an
episode hands the trainer are exactly what `GET /sessions/{id}/export` returns for its
session under the same style and turn discount, and the viewer shows the session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gateway_helpers import ADMIN_KEY, admin_headers, http_client

import gateway.app
from gateway.config import GatewayConfig
from gateway.inference.fake import FakeEngine
from gateway.server import BackgroundGateway
from trainer.algorithm.actor import to_sequences
from trainer.api.registry import make_env
from trainer.loading import import_file
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.queue_agents import QueueAgentRunner
from trainer.rollout.token_episodes import TokenWorkflowRunner

REPO = Path(__file__).resolve().parent.parent
REMAX = import_file(REPO / "agents" / "remax.py")
MATH_AGENT = import_file(REPO / "agents" / "math_multi_turn_queue.py")
ROW = {
    "messages": [{"role": "user", "content": "Tom has 2 apples and gets 3 more."}],
    "answer": "5",
}


class GreedyScripted(FakeEngine):
    """Greedy requests answer `greedy_text`; sampled ones take the script (or the reply)."""

    greedy_text = "The answer is 4."

    async def generate(self, prompt_ids, params, **kwargs):  # type: ignore[no-untyped-def]
        if params.temperature == 0:
            self.script(self.greedy_text)
        return await super().generate(prompt_ids, params)


@pytest.fixture
def gateway_with(new_database, tokenizer, monkeypatch) -> Iterator[Callable[..., Any]]:
    """`gateway_with(EngineClass)`: a running gateway over that fake engine."""
    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
    started: list[BackgroundGateway] = []

    def make(cls: type[FakeEngine] = FakeEngine) -> BackgroundGateway:
        engine = cls(
            reply_ids=tokenizer.encode("The answer is 5.", add_special_tokens=False),
            stop_id=int(tokenizer.eos_token_id),
            encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
        )
        config = GatewayConfig(port=0, database=new_database(), admin_key=ADMIN_KEY, engine="fake")
        started.append(BackgroundGateway(config, engine=engine).start())
        return started[-1]

    yield make
    for gw in started:
        gw.stop()


def rest_export(gw: BackgroundGateway, session_id: str, style: str, gamma: float) -> list[dict]:
    with http_client() as http:
        r = http.get(
            f"{gw.url}/sessions/{session_id}/export",
            params={"style": style, "turn_discount": gamma},
            headers=admin_headers(),
        )
    assert r.status_code == 200, r.text
    return r.json()["samples"]


def stored(gw: BackgroundGateway, session_id: str) -> list[dict]:
    return gw.state.repo.completions(session_id)


def assert_trains_the_export(episodes, gw, style: str, gamma: float) -> None:  # type: ignore[no-untyped-def]
    """What the trainer's step gets is the REST export of each episode's session."""
    for ep in episodes:
        assert ep.error is None, ep.error
        assert ep.samples == rest_export(gw, ep.session_id, style, gamma)
    batch = to_sequences(episodes)
    exported = [s for ep in episodes for s in rest_export(gw, ep.session_id, style, gamma)]
    assert len(batch) == len(exported)
    for seq, s in zip(batch, exported, strict=True):
        assert seq["input_ids"].tolist() == s["input_ids"]
        assert seq["loss_mask"].tolist() == s["loss_mask"]
        assert seq["versions"].tolist() == s["versions"]
        assert seq["logprobs"].tolist() == pytest.approx(s["logprobs"])
        assert float(seq["returns"]) == pytest.approx(s["returns"])
        assert float(seq["temperature"]) == pytest.approx(s["temperature"])


def viewer_shows(gw: BackgroundGateway, session_id: str, completion_ids: list[str]) -> None:
    with http_client() as http:
        r = http.get(
            f"{gw.url.removesuffix('/v1')}/ui/sessions/{session_id}", headers=admin_headers()
        )
    assert r.status_code == 200, r.text
    assert all(cid in r.text for cid in completion_ids)


@pytest.mark.parametrize("style", ["individual", "concat"])
async def test_a_workflows_generations_rewards_and_samples_are_the_stores(
    gateway_with, tokenizer, style
) -> None:
    gw = gateway_with(GreedyScripted)
    workflow = REMAX.ReMaxRLVRWorkflow(
        gconfig={"max_new_tokens": 32, "temperature": 0.7}, tokenizer=tokenizer
    )
    runner = TokenWorkflowRunner(
        workflow, RolloutEngine.for_gateway(gw), export_style=style, turn_discount=0.9
    )
    episodes = await runner.run_group(dict(ROW), 0, 2)
    assert_trains_the_export(episodes, gw, style, 0.9)
    for ep in episodes:
        # the sampled answer (right) and the greedy baseline (wrong) are both recorded
        sampled, greedy = sorted(
            stored(gw, ep.session_id), key=lambda c: c["request"]["temperature"], reverse=True
        )
        assert sampled["request"]["temperature"] == 0.7 and greedy["request"]["temperature"] == 0
        assert sampled["endpoint"] == greedy["endpoint"] == "direct"
        # the returned sequence's reward (the ReMax advantage) is on the sampled answer
        assert sampled["reward"] == 1.0 and ep.reward == 1.0
        # the baseline is not trained on: a side request, with no reward
        assert greedy["side_request"] and greedy["reward"] is None
        (s,) = ep.samples
        assert s["completion_ids"] == [sampled["id"]] and s["temperature"] == 0.7
        assert s["input_ids"] == sampled["prompt_ids"] + sampled["output_ids"]
        # ReMax's own per-token key reaches its custom step, aligned with the sample
        (raw,) = ep.raw
        assert raw["rewards"].shape == (len(s["input_ids"]),)
        viewer_shows(gw, ep.session_id, [sampled["id"], greedy["id"]])


async def test_a_multi_turn_queue_agents_turns_are_linked_and_discounted(
    gateway_with, tokenizer
) -> None:
    gw = gateway_with()
    # turn 1: two samples, one right and one wrong; turn 2: the wrong one is right
    gw.engine.script("The answer is 5.", "The answer is 4.", "So it is 5.")
    agent = MATH_AGENT.MathMultiTurnQueueAgent(
        gconfig={"n_samples": 2, "max_new_tokens": 32, "temperature": 0.7},
        num_turns=2,
        turn_penalty=0.5,
        tokenizer=tokenizer,
    )
    env = make_env("math-single-step")
    engine = RolloutEngine.for_gateway(gw)
    runner = QueueAgentRunner(agent, env, engine, export_style="individual", turn_discount=0.5)
    (ep,) = await runner.run_group(dict(ROW), 0, 1)
    assert ep.error is None and ep.num_completions == 3

    gens = stored(gw, ep.session_id)
    right_at_once, wrong, right_later = (
        next(c for c in gens if tokenizer.decode(c["output_ids"]).startswith(text))
        for text in ("The answer is 5.", "The answer is 4.", "So it is 5.")
    )
    # the second turn is linked to the first answer of its own trajectory
    assert right_later["parent_id"] == wrong["id"] and right_later["tokens_continue_parent"]
    assert right_at_once["parent_id"] is None and wrong["parent_id"] is None
    # each trajectory's reward is on its last turn; the earlier turn has none of its own
    assert (right_at_once["reward"], wrong["reward"], right_later["reward"]) == (1.0, None, 0.5)

    # individual: the first turn's return is its child's, discounted once
    assert_trains_the_export([ep], gw, "individual", 0.5)
    returns = {s["completion_ids"][0]: s["returns"] for s in ep.samples}
    assert returns == {right_at_once["id"]: 1.0, wrong["id"]: 0.25, right_later["id"]: 0.5}

    # concat (the example's config): one sequence per trajectory, per-turn returns
    gw.engine.script("The answer is 5.", "The answer is 4.", "So it is 5.")
    runner = QueueAgentRunner(agent, env, engine, export_style="concat", turn_discount=0.5)
    (ep,) = await runner.run_group(dict(ROW), 0, 1)
    assert_trains_the_export([ep], gw, "concat", 0.5)
    two_turns = next(s for s in ep.samples if len(s["completion_ids"]) == 2)
    trained = {
        r for r, m in zip(two_turns["token_returns"], two_turns["loss_mask"], strict=True) if m
    }
    assert trained == {0.25, 0.5} and two_turns["returns"] == 0.25
    # the trajectory the agent returned is the sample, token for token
    raw = ep.raw[ep.samples.index(two_turns)]
    assert list(raw["input_ids"]) == two_turns["input_ids"]
    assert [int(x) for x in torch.as_tensor(raw["loss_mask"])] == two_turns["loss_mask"]
    viewer_shows(gw, ep.session_id, two_turns["completion_ids"])
