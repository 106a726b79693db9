"""The built-in policy-gradient losses (`train.loss`: grpo, ppo, reinforce).

A new loss is one function decorated `@register_loss("name")` (trainer/api/registry.py
says what it gets and returns).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.api.config import TrainConfig
from trainer.api.registry import LOSSES, LossResult, register_loss

get_loss = LOSSES.lookup  # through this module, so the built-ins are registered


@register_loss("grpo")
def grpo(logprobs: torch.Tensor, mb: dict[str, torch.Tensor], cfg: TrainConfig) -> LossResult:
    """The decoupled PPO objective (stale-safe); plain PPO while every token is fresh."""
    behav = mb["logprobs"]
    prox = mb.get("prox_logprobs", behav)
    clip = PPOClip(cfg.eps_clip, cfg.behav_imp_weight_cap)
    return decoupled_ppo_loss(logprobs, prox, behav, mb["advantages"], mb["loss_mask"], clip)


@register_loss("ppo")
def ppo(logprobs: torch.Tensor, mb: dict[str, torch.Tensor], cfg: TrainConfig) -> LossResult:
    """PPO clipped around the behaviour policy, however stale it is."""
    return ppo_clip_loss(logprobs, mb["logprobs"], mb["advantages"], mb["loss_mask"], cfg.eps_clip)


@register_loss("reinforce")
def reinforce(logprobs: torch.Tensor, mb: dict[str, torch.Tensor], cfg: TrainConfig) -> LossResult:
    return reinforce_loss(logprobs, mb["advantages"], mb["loss_mask"])


@dataclass(frozen=True, slots=True)
class PPOClip:
    """The decoupled objective's two bounds, which always travel together: the PPO clip
    on the ratio to the proximal policy (`train.eps_clip`) and the cap on the
    behaviour importance weight (`train.behav_imp_weight_cap`; inf: uncapped)."""

    eps: float = 0.2
    behav_weight_cap: float = 5.0


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip: float = 0.2,
) -> LossResult:
    """GRPO/PPO clipped surrogate: -min(r A, clip(r, 1-eps, 1+eps) A), r = pi / pi_old.

    The decoupled objective with the proximal policy equal to the behaviour policy.
    """
    clip = PPOClip(eps_clip, float("inf"))
    loss_sum, stats = decoupled_ppo_loss(
        logprobs, old_logprobs, old_logprobs, advantages, mask, clip
    )
    return loss_sum, {k: stats[k] for k in ("clip_frac", "ratio_mean", "approx_kl")}


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: PPOClip = PPOClip(),
) -> LossResult:
    """PPO for off-policy (stale) rollouts: trust region around the proximal policy.

    The behaviour policy (the weights that sampled a token, maybe several versions old)
    and the proximal policy (the weights at the start of this step) are kept apart:
    the ratio pi/pi_prox is clipped as in PPO, and the whole term is reweighted by
    pi_prox/pi_behav, truncated at `clip.behav_weight_cap` so one very stale token cannot
    dominate the step. With fresh rollouts pi_prox == pi_behav and this is plain PPO.
    """
    mask = mask.float()
    log_ratio = (logprobs - prox_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip.eps, 1.0 + clip.eps) * advantages
    surrogate = -torch.minimum(unclipped, clipped)

    behav_log_w = ((prox_logprobs - behav_logprobs) * mask).detach()
    behav_w = torch.exp(behav_log_w).clamp(max=clip.behav_weight_cap)
    loss_sum = (surrogate * behav_w * mask).sum()

    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((unclipped != clipped).float() * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
            "approx_kl": float(((ratio - 1 - log_ratio) * mask).sum() / n),
            "behav_weight_mean": float((behav_w * mask).sum() / n),
            "behav_weight_capped_frac": float(
                ((torch.exp(behav_log_w) > clip.behav_weight_cap).float() * mask).sum() / n
            ),
        }
    return loss_sum, stats


def reinforce_loss(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> LossResult:
    """Vanilla policy gradient: -A log pi(a)."""
    loss_sum = -(logprobs * advantages * mask.float()).sum()
    return loss_sum, {}
