"""GRPO advantages: how much better each sample did than its group (same prompt)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def grpo_advantages(
    returns: list[float], groups: list[int], norm: str = "group", eps: float = 1e-6
) -> list[float]:
    """Subtract the group mean; scale by the group std ("group"), batch std ("batch"), or not ("none").

    A group whose samples all scored the same carries no signal and gets zeros.
    """
    if len(returns) != len(groups):
        raise ValueError("returns and groups must have the same length")
    if norm not in ("group", "batch", "none"):
        raise ValueError(f"adv_norm must be group, batch or none; got {norm!r}")
    r = np.asarray(returns, dtype=np.float64)
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    adv = np.zeros_like(r)
    for idx in members.values():
        vals = r[idx]
        centered = vals - vals.mean()
        if norm == "group":
            std = vals.std()
            centered = centered / (std + eps) if std > eps else np.zeros_like(centered)
        adv[idx] = centered
    if norm == "batch":
        std = adv.std()
        if std > eps:
            adv = adv / (std + eps)
    return adv.tolist()
