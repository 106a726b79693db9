"""The DeepSpeed-run policy: every ZeRO stage trains and hands back whole weights."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import make_tiny_model

from trainer.config import TrainConfig
from trainer.losses import ppo_clip_loss
from trainer.packing import pack, token_logprobs


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tokenizer):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


def _samples() -> list[dict]:
    return [
        {
            "input_ids": [5, 6, 7, 8, 9, 10],
            "loss_mask": [0, 0, 0, 1, 1, 1],
            "logprobs": [0.0] * 6,
            "versions": [-1] * 6,
        },
        {
            "input_ids": [11, 12, 13, 14],
            "loss_mask": [0, 0, 1, 1],
            "logprobs": [0.0] * 4,
            "versions": [-1] * 4,
        },
    ]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_zero_stage_takes_a_step_and_exports_full_weights(stage, tiny_model_dir) -> None:
    from trainer.ds_engine import DeepSpeedPolicy

    policy = DeepSpeedPolicy(
        tiny_model_dir, TrainConfig(zero_stage=stage, lr=1e-2, micro_batch_tokens=6)
    )
    before = {k: v.clone() for k, v in policy.full_state_dict().items()}
    batches = pack(_samples(), [1.0, -1.0], max_tokens=6)
    assert len(batches) == 2  # two micro-batches accumulate into one step
    with torch.no_grad():
        for b in batches:
            b.old_logprobs = token_logprobs(policy.engine, b).detach()

    stats = policy.train_step(
        batches, lambda lp, mb: ppo_clip_loss(lp, mb.old_logprobs, mb.advantages, mb.loss_mask, 0.2)
    )

    assert stats["trained_tokens"] == 5
    after = policy.full_state_dict()
    assert set(after) == set(before)
    assert all(after[k].shape == before[k].shape and after[k].numel() > 0 for k in after)
    assert any(not torch.equal(after[k], before[k]) for k in after), "no weight moved"


def test_unknown_zero_stage_is_a_clear_error(tiny_model_dir) -> None:
    from trainer.ds_engine import DeepSpeedPolicy

    with pytest.raises(ValueError, match="zero_stage"):
        DeepSpeedPolicy(tiny_model_dir, TrainConfig(zero_stage=4))
