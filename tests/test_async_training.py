"""Async off-policy training: the staleness bound, per-token versions, the decoupled loss."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from trainer_helpers import RandomRewardAgent, make_tiny_model, rows

from trainer.algorithm.losses import PPOClip, decoupled_ppo_loss, ppo_clip_loss
from trainer.api.config import RolloutConfig
from trainer.rollout.agent_runner import Episode
from trainer.rollout.controller import RolloutController
from trainer.rollout.data_order import DataOrder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


# ---- the controller ------------------------------------------------------------------
def _rollout(max_staleness: int) -> RolloutConfig:
    """Batches of two groups of one episode each."""
    return RolloutConfig(batch_size=2, group_size=1, max_staleness=max_staleness)


async def _started_before_first_update(max_staleness: int) -> tuple[list[int], list[int]]:
    started: list[int] = []
    release = asyncio.Event()

    async def run_group(data, group, size):  # type: ignore[no-untyped-def]
        started.append(group)
        if group >= 2:  # later groups wait, like slow agents
            await release.wait()
        return [Episode(group=group, session_id=f"s{group}")]

    ctl = RolloutController(run_group, rows(8), DataOrder(8, 0), _rollout(max_staleness))
    ctl.start()
    first = await ctl.next_batch()
    await asyncio.sleep(0.05)
    before = list(started)
    await ctl.set_version(1)
    await asyncio.sleep(0.05)
    release.set()
    await ctl.stop()
    return before, [g for g, _ in first]


async def test_max_staleness_zero_runs_one_batch_per_version() -> None:
    before, first = await _started_before_first_update(0)
    assert sorted(first) == [0, 1]
    assert sorted(before) == [0, 1]  # nothing runs ahead of the policy


async def test_max_staleness_one_collects_the_next_batch_while_training() -> None:
    before, _ = await _started_before_first_update(1)
    assert sorted(before) == [0, 1, 2, 3]  # one batch ahead, no more


async def test_a_slow_group_is_not_overtaken_so_the_bound_holds() -> None:
    async def run_group(data, group, size):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.3 if group == 0 else 0.0)
        return [Episode(group=group, session_id=f"s{group}")]

    ctl = RolloutController(run_group, rows(8), DataOrder(8, 0), _rollout(max_staleness=1))
    ctl.start()
    first = [g for g, _ in await ctl.next_batch()]
    await ctl.set_version(1)
    second = [g for g, _ in await ctl.next_batch()]
    await ctl.stop()
    # groups 2 and 3 finished long before group 0, yet batches keep start order
    assert first == [0, 1] and second == [2, 3]


async def test_a_crashing_runner_becomes_an_errored_episode_not_a_hang() -> None:
    async def run_group(data, group, size):  # type: ignore[no-untyped-def]
        raise RuntimeError("runner bug")

    ctl = RolloutController(run_group, rows(4), DataOrder(4, 0), _rollout(max_staleness=0))
    ctl.start()
    batch = await asyncio.wait_for(ctl.next_batch(), 5)
    await ctl.stop()
    assert all("runner bug" in eps[0].error for _, eps in batch)


def test_data_order_resumes_with_groups_that_were_in_flight() -> None:
    order = DataOrder(5, seed=3)
    handed = [order.next_group() for _ in range(4)]
    assert handed == [0, 1, 2, 3]
    for g in (0, 2, 3):  # group 1 was still running when the checkpoint was taken
        order.consumed(g)
    resumed = DataOrder(5, seed=3)
    resumed.load(order.state())
    assert [resumed.next_group() for _ in range(2)] == [1, 4]
    assert [resumed.row(g) for g in range(5)] == [order.row(g) for g in range(5)]
    assert sorted(resumed.row(g) for g in range(5)) == list(range(5))  # a permutation
    with pytest.raises(ValueError, match="different dataset size"):
        DataOrder(6, seed=3).load(order.state())


# ---- the loss ------------------------------------------------------------------------
def test_decoupled_loss_is_ppo_when_rollouts_are_fresh() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    behav = torch.tensor([-1.1, -1.8, -0.4])
    adv = torch.tensor([1.0, -1.0, 0.5])
    mask = torch.ones(3)
    ours, _ = decoupled_ppo_loss(logp, behav, behav, adv, mask, PPOClip(0.2, 5.0))
    ppo, _ = ppo_clip_loss(logp, behav, adv, mask, 0.2)
    assert torch.allclose(ours, ppo)


def test_decoupled_loss_clips_to_the_proximal_policy_and_caps_the_behaviour_weight() -> None:
    logp = torch.tensor([0.0, 0.0], requires_grad=True)
    prox = torch.tensor([-1.0, 0.0])  # token 0: the current policy moved far from prox
    behav = torch.tensor([0.0, -10.0])  # token 1: sampled by a much older policy
    adv = torch.tensor([1.0, 1.0])
    loss, stats = decoupled_ppo_loss(logp, prox, behav, adv, torch.ones(2), PPOClip(0.2, 5.0))
    loss.backward()
    # token 0: ratio e^1 clipped at 1.2 -> no gradient; weight e^(-1-0)
    # token 1: ratio 1, weight e^10 capped at 5 -> gradient -5
    assert torch.allclose(logp.grad, torch.tensor([0.0, -5.0]))
    expected = -(1.2 * torch.exp(torch.tensor(-1.0))) - 5.0
    assert torch.allclose(loss, expected)
    assert stats["behav_weight_capped_frac"] == 0.5


# ---- end to end ----------------------------------------------------------------------
def _train(tmp_path: Path, model: Path, max_staleness: int, steps: int = 4) -> list[dict]:
    from trainer.api import Trainer

    config = {
        "run_dir": str(tmp_path / f"run{max_staleness}"),
        "model": str(model),
        "total_steps": steps,
        "rollout": {"batch_size": 2, "group_size": 2, "max_staleness": max_staleness},
        "gateway": {"default_max_tokens": 8},
        "train": {"lr": 1e-3, "micro_batch_tokens": 512},
        "tensorboard": False,
    }
    trainer = Trainer(config)
    result = trainer.train(workflow=RandomRewardAgent, dataset=rows())
    assert result.policy_version == steps
    return [json.loads(line) for line in result.metrics.read_text().splitlines()]


def _recorded_versions(database: Path) -> list[list[int]]:
    from gateway.store.database import database_url, open_database
    from gateway.store.repository import Repository

    repo = Repository(open_database(database_url(str(database))))
    out = []
    for session in repo.list_sessions(limit=1000):
        for c in repo.completions(session["id"]):
            out.append(list(c["output_versions"]))
    return out


def test_sync_training_never_trains_on_stale_tokens(tmp_path, tiny_model) -> None:
    metrics = _train(tmp_path, tiny_model, max_staleness=0)
    assert [m["policy_version"] for m in metrics] == [1, 2, 3, 4]
    assert all(m["staleness_max"] == 0 for m in metrics)
    assert all(m["prox_recomputed"] == 0 for m in metrics)


def test_async_training_stays_within_max_staleness(tmp_path, tiny_model) -> None:
    metrics = _train(tmp_path, tiny_model, max_staleness=1)
    assert all(m["staleness_max"] <= 1 for m in metrics)
    # the next batch was collected under the old weights while a step trained
    assert any(m["staleness_max"] == 1 and m["prox_recomputed"] == 1 for m in metrics)
    versions = _recorded_versions(tmp_path / "run1" / "sessions.db")
    assert versions and all(v == sorted(v) for v in versions)  # never goes backwards
    assert {x for v in versions for x in v} <= {0, 1, 2, 3, 4}


async def test_a_weight_update_mid_generation_stamps_each_token_with_its_version(
    tiny_model,
) -> None:
    from gateway.inference.base import GenerationResult, SamplingParams
    from gateway.inference.embedded import EmbeddedEngine

    engine = EmbeddedEngine(str(tiny_model))
    await engine.start()
    try:
        new_weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
        params = SamplingParams(max_new_tokens=60, temperature=1.0, seed=1, stop_token_ids=[])
        seen = 0
        result = None
        async for item in engine.stream([1, 2, 3, 4], params):
            if isinstance(item, GenerationResult):
                result = item
                break
            seen += len(item.token_ids)
            if seen >= 5 and engine.version == 0:
                await asyncio.to_thread(engine.load_state_dict, new_weights, 1)
        assert result is not None and len(result.versions) == len(result.output_ids) == 60
        assert result.versions == sorted(result.versions)
        assert result.versions[0] == 0 and result.versions[-1] == 1
        assert 5 <= result.versions.index(1) < 60
    finally:
        await engine.close()
