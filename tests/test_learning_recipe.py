"""The knobs that keep a run from collapsing, and the signals that show one, each checked
against a hand computation (#30): learning-rate schedule, KL penalty to the starting
policy, zero-spread groups, entropy, repetition, truncation, and the collapse warning."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import make_tiny_model

from trainer.algorithm.actor import PPOActor, kl_k3, zero_spread_share
from trainer.algorithm.losses import grpo
from trainer.api.config import ConfigError, TrainConfig
from trainer.backend.batches import pad_sequences
from trainer.backend.deepspeed_engine import lr_factor
from trainer.backend.functional import forward_logits, next_token_entropy, next_token_logprobs
from trainer.health import CollapseWatch, answer_signals, repetition


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tokenizer):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


# ---- learning-rate schedule ---------------------------------------------------------------


def test_cosine_schedule_after_warmup_by_hand() -> None:
    cfg = TrainConfig(warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1, lr_decay_steps=6)
    # warm-up 1/3, 2/3; then 0.1 + 0.9 * (1 + cos(pi * p)) / 2 for p = 0, 1/3, 2/3, 1; held
    expected = [1 / 3, 2 / 3, 1.0, 0.775, 0.325, 0.1, 0.1, 0.1]
    assert [lr_factor(u, cfg) for u in range(8)] == pytest.approx(expected)
    constant = TrainConfig(warmup_steps=1, lr_decay_steps=6)
    assert [lr_factor(u, constant) for u in range(4)] == pytest.approx([0.5, 1, 1, 1])


def test_the_engine_runs_the_cosine_schedule(tiny_model_dir) -> None:
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    cfg = TrainConfig(lr=1e-2, lr_schedule="cosine", min_lr_ratio=0.0, lr_decay_steps=3)
    policy = DeepSpeedEngine(tiny_model_dir, cfg)
    rates = [policy.train_batch(*_one_step_args())["lr"] for _ in range(4)]
    assert rates == pytest.approx([1e-2, 5e-3, 0.0, 0.0], abs=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr_schedule": "linear"}, "lr_schedule"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
        ({"kl_coef": -0.1}, "kl_coef"),
    ],
)
def test_bad_schedule_or_kl_settings_are_config_errors(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kwargs)


def _one_step_args():
    seq = {
        "input_ids": torch.tensor([5, 6, 7, 8]),
        "loss_mask": torch.tensor([0, 0, 1, 1]),
        "advantages": torch.tensor([0.0, 0.0, 1.0, 1.0]),
    }

    def loss_fn(logits, mb):
        return -next_token_logprobs(logits, mb)[mb["loss_mask"] > 0].sum() * mb["advantages"].sum()

    return pad_sequences([seq]), loss_fn, lambda mb: mb["loss_mask"].sum()


# ---- KL to the starting policy ------------------------------------------------------------


def test_k3_kl_by_hand() -> None:
    logp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.2)])
    # r = log 0.25 - log 0.5 = -log 2: 0.5 + log 2 - 1; equal logprobs: 0
    assert kl_k3(logp, ref).tolist() == pytest.approx([math.log(2) - 0.5, 0.0])


def _sequences(returns: list[float]) -> list[dict[str, torch.Tensor]]:
    """One group of sequences with the given returns and on-policy logprobs."""
    out = []
    for i, r in enumerate(returns):
        ids = torch.tensor([5, 6, 7 + i, 8 + i, 9 + i])
        out.append(
            {
                "input_ids": ids,
                "loss_mask": torch.tensor([0, 0, 1, 1, 1]),
                "logprobs": torch.zeros(5),  # filled in from the model below
                "versions": torch.zeros(5, dtype=torch.long),
                "token_returns": torch.full((5,), r),
                "returns": torch.tensor(r),
                "temperature": torch.tensor(1.0),
                "group": torch.tensor(0),
            }
        )
    return out


def _on_policy(policy, seqs):
    """The sampler's logprobs are the policy's own, as in a synchronous run."""
    with torch.no_grad():
        for s in seqs:
            ids = s["input_ids"]
            mb = {"input_ids": ids, "position_ids": torch.arange(len(ids))}
            s["logprobs"] = next_token_logprobs(forward_logits(policy.module, mb), mb)
    return pad_sequences(seqs)


def test_kl_penalty_is_added_to_the_loss_by_hand(tiny_model_dir) -> None:
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    cfg = TrainConfig(kl_coef=0.5, lr=1e-2)
    policy = DeepSpeedEngine(tiny_model_dir, cfg)
    actor = PPOActor(policy, cfg)
    with torch.no_grad():  # move the policy off its reference
        for p in policy.module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.tensor([5, 6, 7, 8, 9])
    mb = {
        "input_ids": ids,
        "position_ids": torch.arange(5),
        "loss_mask": torch.tensor([0, 0, 1, 1, 1]),
        "logprobs": torch.full((5,), -3.0),
        "advantages": torch.tensor([0.0, 0.0, 1.0, -0.5, 2.0]),
        "cu_seqlens": torch.tensor([0, 5]),
    }
    logits = forward_logits(policy.module, mb)
    loss, stats = actor._loss_fn(stale=False)(logits, mb)

    logp = next_token_logprobs(logits, mb)
    ref = next_token_logprobs(forward_logits(actor.reference, mb), mb)
    mask = mb["loss_mask"].float()
    k3 = (torch.exp(ref - logp) - (ref - logp) - 1) * mask
    pg, _ = grpo(logp, mb, cfg)
    assert float(loss.detach()) == pytest.approx(float((pg + 0.5 * k3.sum()) / 3), rel=1e-5)
    assert stats["kl_ref"] == pytest.approx(float(k3.sum() / 3), rel=1e-5)
    assert stats["kl_ref"] > 0
    assert stats["logprob_mismatch"] == pytest.approx(float(((logp + 3.0).abs() * mask).sum() / 3))


def test_kl_pulls_a_drifted_policy_back_even_when_no_group_has_spread(tiny_model_dir) -> None:
    """Every answer scored the same: no policy gradient. Without a KL term nothing moves;
    with one, the step trains those samples too and the policy comes closer to its start."""
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    def drifted(kl_coef):
        cfg = TrainConfig(kl_coef=kl_coef, lr=3e-3)
        policy = DeepSpeedEngine(tiny_model_dir, cfg)
        actor = PPOActor(policy, cfg)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in policy.module.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return policy, actor

    policy, actor = drifted(0.0)
    before = {k: v.clone() for k, v in policy.full_state_dict().items()}
    stats = actor.train(_on_policy(policy, _sequences([0.0, 0.0, 0.0])), version=0)
    assert stats["num_trained_samples"] == 0 and stats["zero_spread_frac"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in policy.full_state_dict().items())

    policy, actor = drifted(1.0)
    kls = []
    for _ in range(3):
        stats = actor.train(_on_policy(policy, _sequences([0.0, 0.0, 0.0])), version=0)
        assert stats["num_trained_samples"] == 3
        kls.append(stats["kl_ref"])
    assert kls[0] > 0 and kls[-1] < kls[0]


def test_reference_is_the_starting_policy_and_stays_frozen(tiny_model_dir) -> None:
    from trainer.backend.deepspeed_engine import DeepSpeedEngine

    cfg = TrainConfig(lr=1e-2)
    policy = DeepSpeedEngine(tiny_model_dir, cfg)
    start = {k: v.clone() for k, v in policy.full_state_dict().items()}
    actor = PPOActor(policy, cfg)
    stats = actor.train(_on_policy(policy, _sequences([1.0, 0.0, 0.5])), version=0)
    assert stats["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the first step starts from it
    ref = actor.reference.state_dict()
    assert all(torch.equal(ref[k], start[k]) for k in start if k in ref)
    moved = policy.full_state_dict()
    assert any(not torch.equal(moved[k], start[k]) for k in start)
    assert not any(p.requires_grad for p in actor.reference.parameters())


# ---- signals ------------------------------------------------------------------------------


def test_zero_spread_share_by_hand() -> None:
    returns = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert zero_spread_share(returns, groups) == pytest.approx(2 / 3)


def test_entropy_by_hand_with_temperature() -> None:
    # position t predicts token t + 1; the last position predicts nothing
    logits = torch.tensor([[0.0, 0, 0, 0], [2.0, 0, 0, 0], [9.0, 9, 9, 9], [5.0, 0, 0, 0]])
    mb = {"input_ids": torch.tensor([0, 1, 2, 3]), "temperature": torch.full((4,), 2.0)}
    got = next_token_entropy(logits, mb)
    p = torch.softmax(torch.tensor([1.0, 0.0, 0.0, 0.0]), -1)  # [2, 0, 0, 0] / temperature 2
    h = float(-(p * p.log()).sum())
    assert got.tolist() == pytest.approx([0.0, math.log(4), h, math.log(4)])


def test_repetition_and_answer_signals_by_hand() -> None:
    assert repetition([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)  # 5 4-grams, 4 distinct
    assert repetition([1, 2, 3]) == 0.0
    samples = [
        {"input_ids": [9, 9, 1, 2, 3, 4, 1, 2, 3, 4], "loss_mask": [0, 0] + [1] * 8,
         "meta": {"finish_reason": "length"}},
        {"input_ids": [9, 5, 6], "loss_mask": [0, 1, 1], "meta": {"finish_reason": "stop"}},
    ]  # fmt: skip
    assert answer_signals(samples) == pytest.approx(
        {"answer_tokens_mean": 5.0, "truncated_frac": 0.5, "repetition": 0.1}
    )


def _row(step, reward, **kw):
    return {"step": step, "reward_mean": reward, "truncated_frac": 0.05, "repetition": 0.02,
            "entropy": 0.6, "kl_ref": 0.01, "logprob_mismatch": 0.001, **kw}  # fmt: skip


def test_collapse_warning_fires_once_when_reward_falls_and_answers_get_cut() -> None:
    watch = CollapseWatch()
    healthy = [_row(i, r) for i, r in enumerate([0.2, 0.5, 0.6, 0.6, 0.62, 0.6], start=1)]
    assert [watch.check(r) for r in healthy] == [None] * 6
    collapsing = [_row(7 + i, r, truncated_frac=0.7) for i, r in enumerate([0.2, 0.05, 0.0, 0.0])]
    lines = [watch.check(r) for r in collapsing]
    fired = [line for line in lines if line]
    assert len(fired) == 1 and fired[0].startswith("warning: step 8 looks like a collapse")
    assert "cut off" in fired[0] and "training reward" in fired[0]


def test_collapse_warning_needs_a_reward_drop_or_degenerate_text() -> None:
    watch = CollapseWatch()
    assert watch.check(_row(1, 0.3, truncated_frac=0.6)) is None  # one signal alone
    # learning also lowers entropy and raises KL: no warning while the reward holds
    for step in range(2, 6):
        assert watch.check(_row(step, 0.3 + 0.1 * step, entropy=0.1, kl_ref=0.9)) is None
    line = CollapseWatch().check(_row(1, 0.3, truncated_frac=0.6, repetition=0.4))
    assert line and "repetition" in line and "cut off" in line
    mismatch = CollapseWatch().check(_row(1, 0.3, logprob_mismatch=0.05))
    assert mismatch and "mismatch" in mismatch  # the sampler and trainer disagree: a bug
