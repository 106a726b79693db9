"""Advantage estimators, chosen by name (`train.advantage`): a new one is one function.

`@register_advantage("name") def fn(batch, cfg)` gets one step's padded batch: (B,)
`returns` and `group` (the dataset row), (B, L) `token_returns` (each token's own
return: the scalar return unless a concat export gave per-turn ones), `loss_mask`, ...;
and the `TrainConfig`. It returns every token's advantage (B, L); masked tokens are
ignored, and samples with no nonzero advantage are not trained on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gateway.registry import Registry
from trainer.config import ConfigError, TrainConfig

Estimator = Callable[[dict[str, torch.Tensor], TrainConfig], torch.Tensor]
ESTIMATORS: Registry[Estimator] = Registry("train.advantage", "estimators", error=ConfigError)
register_advantage = ESTIMATORS.register  # `@register_advantage("name")`: `train.advantage`
get_advantage = ESTIMATORS.lookup


@register_advantage("grpo")
def grpo(batch: dict[str, torch.Tensor], cfg: TrainConfig) -> torch.Tensor:
    """How much better each sample did than its group (same prompt), `train.adv_norm`.

    A concat sample's tokens are scored by their own turn's return against its group's
    baseline (from the scalar returns), so a later turn is credited with what followed it.
    """
    mean, scale = group_baselines(batch["returns"], batch["group"], cfg.adv_norm)
    token_returns = batch["token_returns"].double()
    return (token_returns - mean[:, None]) * scale[:, None]


def group_baselines(
    returns: torch.Tensor, groups: torch.Tensor, norm: str = "group", eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: the group mean to subtract and the scale to multiply by.

    Scale is 1/std of the group ("group"), 1/std of all centred returns ("batch") or 1
    ("none"). A group whose samples all scored the same carries no signal: scale 0.
    """
    if norm not in ("group", "batch", "none"):
        raise ValueError(f"adv_norm must be group, batch or none; got {norm!r}")
    r = returns.double()
    mean = torch.zeros_like(r)
    scale = torch.ones_like(r)
    for g in groups.unique():
        idx = groups == g
        mean[idx] = r[idx].mean()
        std = float(r[idx].std(unbiased=False))
        if std <= eps:
            scale[idx] = 0.0
        elif norm == "group":
            scale[idx] = 1.0 / (std + eps)
    if norm == "batch":
        std = float(((r - mean) * (scale > 0)).std(unbiased=False))
        if std > eps:
            scale = scale / (std + eps)
    return mean, scale
