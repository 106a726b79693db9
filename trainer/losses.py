"""Policy-gradient losses on packed token arrays.

Each returns the SUM over trained tokens; the caller divides by the number of trained
tokens in the whole step, so every token weighs the same however the step was split
into micro-batches.
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip: float = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO/PPO clipped surrogate: -min(r A, clip(r, 1-eps, 1+eps) A)."""
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss_sum = (per_token * mask).sum()

    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((unclipped != clipped).float() * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
            "approx_kl": float(((ratio - 1 - log_ratio) * mask).sum() / n),
        }
    return loss_sum, stats


def reinforce_loss(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Vanilla policy gradient: -A log pi(a)."""
    loss_sum = -(logprobs * advantages * mask).sum()
    return loss_sum, {}
