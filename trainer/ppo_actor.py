"""One training step on recorded samples: advantages, packing, the loss, staleness.

Reads top to bottom like the algorithm: GRPO advantages within each prompt's group,
drop samples that carry no signal, pack the rest, and take one optimizer step with the
decoupled PPO loss (or REINFORCE). When any token was sampled by older weights than
the ones being trained, the proximal policy's logprobs are recomputed first;
otherwise they equal the behaviour logprobs and the extra forward pass is skipped.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.advantages import sample_advantages
from trainer.config import TrainConfig
from trainer.ds_engine import DeepSpeedEngine
from trainer.losses import decoupled_ppo_loss, reinforce_loss
from trainer.packing import PackedBatch, pack

ALGORITHMS = ("grpo", "reinforce")


def check_algorithm(name: str) -> None:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown train.algorithm {name!r}: choose one of {list(ALGORITHMS)}")


def staleness_stats(samples: list[dict[str, Any]], version: int) -> dict[str, float]:
    """How many versions behind the trained policy each generated token was sampled."""
    lags = [
        version - v
        for s in samples
        for v, m in zip(s["versions"], s["loss_mask"], strict=True)
        if m and v >= 0
    ]
    if not lags:
        return {}
    return {
        "staleness_mean": sum(lags) / len(lags),
        "staleness_max": float(max(lags)),
        "stale_token_frac": sum(1 for lag in lags if lag > 0) / len(lags),
    }


def train_on_samples(
    policy: DeepSpeedEngine,
    cfg: TrainConfig,
    samples: list[dict[str, Any]],
    groups: list[int],
    version: int,
) -> dict[str, float]:
    """One optimizer step; `version` is the policy version being trained (pre-step)."""
    check_algorithm(cfg.algorithm)
    stats: dict[str, float] = {"num_samples": float(len(samples))}
    if not samples:
        return stats
    advantages = sample_advantages(samples, groups, cfg.adv_norm)
    # samples with zero advantage add nothing to the gradient; skip their compute
    keep = [i for i, a in enumerate(advantages) if _has_signal(a)]
    stats["num_trained_samples"] = float(len(keep))
    kept = [samples[i] for i in keep]
    stats.update(staleness_stats(kept, version))
    if not keep:
        return stats
    batches = pack(kept, [advantages[i] for i in keep], cfg.micro_batch_tokens)

    if cfg.algorithm == "grpo":
        stale = any(bool(((b.versions < version) & (b.versions >= 0)).any()) for b in batches)

        def loss_fn(logp: torch.Tensor, mb: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
            prox = mb.prox_logprobs if mb.prox_logprobs is not None else mb.old_logprobs
            return decoupled_ppo_loss(
                logp,
                prox,
                mb.old_logprobs,
                mb.advantages,
                mb.loss_mask,
                cfg.eps_clip,
                cfg.behav_imp_weight_cap,
            )

        stats["prox_recomputed"] = float(stale)
        stats.update(policy.train_step(batches, loss_fn, recompute_prox=stale))
    else:

        def loss_fn(logp: torch.Tensor, mb: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
            return reinforce_loss(logp, mb.advantages, mb.loss_mask)

        stats.update(policy.train_step(batches, loss_fn))
    return stats


def _has_signal(advantage: float | list[float]) -> bool:
    if isinstance(advantage, list):
        return any(abs(a) > 1e-8 for a in advantage)
    return abs(advantage) > 1e-8
