"""GRPO advantages: how much better each sample did than its group (same prompt)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np


def group_baselines(
    returns: list[float], groups: list[int], norm: str = "group", eps: float = 1e-6
) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: the group mean to subtract and the scale to multiply by.

    Scale is 1/std of the group ("group"), 1/std of all centred returns ("batch") or 1
    ("none"). A group whose samples all scored the same carries no signal: scale 0.
    """
    if len(returns) != len(groups):
        raise ValueError("returns and groups must have the same length")
    if norm not in ("group", "batch", "none"):
        raise ValueError(f"adv_norm must be group, batch or none; got {norm!r}")
    r = np.asarray(returns, dtype=np.float64)
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    mean = np.zeros_like(r)
    scale = np.ones_like(r)
    for idx in members.values():
        vals = r[idx]
        mean[idx] = vals.mean()
        std = vals.std()
        if std <= eps:
            scale[idx] = 0.0
        elif norm == "group":
            scale[idx] = 1.0 / (std + eps)
    if norm == "batch":
        std = ((r - mean) * (scale > 0)).std()
        if std > eps:
            scale = scale / (std + eps)
    return mean, scale


def grpo_advantages(
    returns: list[float], groups: list[int], norm: str = "group", eps: float = 1e-6
) -> list[float]:
    """Subtract the group mean; scale by the group std ("group"), batch std ("batch"), or not ("none")."""
    mean, scale = group_baselines(returns, groups, norm, eps)
    return ((np.asarray(returns, dtype=np.float64) - mean) * scale).tolist()


def sample_advantages(
    samples: list[dict[str, Any]], groups: list[int], norm: str = "group"
) -> list[float | list[float]]:
    """GRPO advantages; per token where a sample carries `token_returns` (concat export).

    The group baseline comes from each sample's scalar `returns`; a concat sample's
    tokens are scored by their own turn's return against that same baseline, so later
    turns are credited with what followed them, not with what came before.
    """
    returns = [float(s["returns"]) for s in samples]
    mean, scale = group_baselines(returns, groups, norm)
    out: list[float | list[float]] = []
    for i, s in enumerate(samples):
        per_token = s.get("token_returns")
        if per_token:
            out.append(
                [
                    float((t - mean[i]) * scale[i]) if m else 0.0
                    for t, m in zip(per_token, s["loss_mask"], strict=True)
                ]
            )
        else:
            out.append(float((returns[i] - mean[i]) * scale[i]))
    return out
