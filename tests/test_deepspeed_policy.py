"""The DeepSpeed-run policy: every ZeRO stage trains and hands back whole weights."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import make_tiny_model

from trainer.algorithm.losses import ppo_clip_loss
from trainer.api.config import TrainConfig
from trainer.backend.batches import pad_sequences
from trainer.backend.functional import next_token_logprobs, predicting_positions


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tokenizer):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


def _batch() -> dict[str, torch.Tensor]:
    seqs = [
        {
            "input_ids": torch.tensor([5, 6, 7, 8, 9, 10]),
            "loss_mask": torch.tensor([0, 0, 0, 1, 1, 1]),
        },
        {"input_ids": torch.tensor([11, 12, 13, 14]), "loss_mask": torch.tensor([0, 0, 1, 1])},
    ]
    for s, advantage in zip(seqs, [1.0, -1.0], strict=True):
        s["advantages"] = torch.full(s["input_ids"].shape, advantage)
        s["logits_mask"] = predicting_positions(s["loss_mask"])  # LM head on trained only
    return pad_sequences(seqs)


def _on_policy_ppo(logits: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    logp = next_token_logprobs(logits, mb)
    loss_sum, _ = ppo_clip_loss(logp, logp.detach(), mb["advantages"], mb["loss_mask"], 0.2)
    return loss_sum / mb["loss_mask"].sum()


@pytest.fixture(scope="module")
def zero3_grad_norm(tiny_model_dir) -> float:
    """The first step's gradient norm as DeepSpeed's ZeRO-3 computes it in `step()`."""
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    policy = DeepSpeedEngine(tiny_model_dir, TrainConfig(zero_stage=3, micro_batch_tokens=6))
    policy.train_batch(_batch(), _on_policy_ppo, lambda mb: mb["loss_mask"].sum())
    return float(policy.ds_engine.get_global_grad_norm())


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_zero_stage_takes_a_step_and_exports_full_weights(
    stage, tiny_model_dir, zero3_grad_norm
) -> None:
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    policy = DeepSpeedEngine(
        tiny_model_dir, TrainConfig(zero_stage=stage, lr=1e-2, micro_batch_tokens=6)
    )
    before = {k: v.clone() for k, v in policy.full_state_dict().items()}

    stats = policy.train_batch(_batch(), _on_policy_ppo, lambda mb: mb["loss_mask"].sum())

    assert stats["micro_batches"] == 2  # two micro-batches accumulate into one step
    assert stats["trained_tokens"] == 5
    after = policy.full_state_dict()
    assert set(after) == set(before)
    assert all(after[k].shape == before[k].shape and after[k].numel() > 0 for k in after)
    assert any(not torch.equal(after[k], before[k]) for k in after), "no weight moved"
    # this step's own gradient norm, the same whichever stage computed it
    assert stats["grad_norm"] == pytest.approx(zero3_grad_norm, rel=1e-5)


def test_unknown_zero_stage_is_a_clear_error(tiny_model_dir) -> None:
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    with pytest.raises(ValueError, match="zero_stage"):
        DeepSpeedEngine(tiny_model_dir, TrainConfig(zero_stage=4))


def test_warmup_raises_the_learning_rate_linearly_then_holds(tiny_model_dir) -> None:
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    policy = DeepSpeedEngine(tiny_model_dir, TrainConfig(lr=1e-2, warmup_steps=3))
    rates = []
    for _ in range(5):
        rates.append(policy.optimizer.param_groups[0]["lr"])
        policy.train_batch(_batch(), _on_policy_ppo, lambda mb: mb["loss_mask"].sum())
    assert rates == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01])


def test_negative_warmup_is_a_config_error() -> None:
    from trainer.api.config import ConfigError

    with pytest.raises(ConfigError, match="warmup_steps"):
        TrainConfig(warmup_steps=-1)
