"""A resumed run continues its step count, optimizer state and data order; TensorBoard."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from trainer_helpers import RandomRewardAgent, make_tiny_model, rows

from trainer.api import Trainer


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


def _config(run_dir: Path, model: Path, steps: int, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "run_dir": str(run_dir),
        "model": str(model),
        "total_steps": steps,
        "seed": 7,
        "rollout": {"batch_size": 2, "group_size": 2},
        "gateway": {"default_max_tokens": 6},
        "train": {"lr": 1e-3, "micro_batch_tokens": 512},
        "checkpoint_every": 2,
        **extra,
    }


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _adam_steps(trainer: Trainer) -> set[int]:
    state = trainer.policy.optimizer.state
    return {int(s["step"]) for s in state.values()}


def _scalars(logdir: Path, tag: str) -> dict[int, float]:
    """Read TensorBoard event files (TFRecord framing around Event protos)."""
    from tensorboardX.proto import event_pb2

    out: dict[int, float] = {}
    for f in sorted(logdir.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                if v.tag == tag:
                    out[event.step] = v.simple_value
    return out


def test_resume_continues_steps_optimizer_and_data_order(tmp_path, tiny_model) -> None:
    straight = Trainer(_config(tmp_path / "straight", tiny_model, 4))
    straight.train(workflow=RandomRewardAgent, dataset=rows(5))
    reference = _metrics(tmp_path / "straight" / "metrics.jsonl")

    first = Trainer(_config(tmp_path / "resumed", tiny_model, 2))
    first.train(workflow=RandomRewardAgent, dataset=rows(5))
    assert (tmp_path / "resumed" / "checkpoints" / "step2").is_dir()

    second = Trainer(_config(tmp_path / "resumed", tiny_model, 4, resume=True))
    result = second.train(workflow=RandomRewardAgent, dataset=rows(5))
    assert result.start_step == 2
    assert result.policy_version == 4 == second.gateway.engine.version
    resumed = _metrics(result.metrics)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    assert [m["policy_version"] for m in resumed] == [1, 2, 3, 4]
    # the same rows, in the same order, as the run that never stopped (across an epoch end)
    assert [m["data_rows"] for m in resumed] == [m["data_rows"] for m in reference]
    # AdamW's state came back: every parameter has taken 4 steps, not 2
    assert _adam_steps(second) == {4} == _adam_steps(straight)
    assert second.policy.global_step == 4

    rewards = _scalars(result.run_dir / "tensorboard", "reward/reward_mean")
    assert sorted(rewards) == [1, 2, 3, 4]
    assert rewards[4] == pytest.approx(resumed[3]["reward_mean"], rel=1e-6)


def test_resume_without_a_checkpoint_starts_fresh(tmp_path, tiny_model) -> None:
    result = Trainer(_config(tmp_path / "fresh", tiny_model, 1, resume=True)).train(
        workflow=RandomRewardAgent, dataset=rows(3)
    )
    assert result.start_step == 0 and result.policy_version == 1
