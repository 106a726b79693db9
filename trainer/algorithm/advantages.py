"""The built-in advantage estimator (`train.advantage: grpo`) and group baselines.

A new estimator is one function decorated `@register_advantage("name")`
(trainer/api/registry.py says what it gets and returns).
"""

from __future__ import annotations

import torch

from trainer.api.config import TrainConfig
from trainer.api.registry import ESTIMATORS, register_advantage

get_advantage = ESTIMATORS.lookup  # through this module, so the built-ins are registered


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
