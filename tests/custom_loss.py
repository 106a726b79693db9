"""A loss and an advantage estimator registered from outside the package.

A config lists this file in `imports:` and selects them with `train.loss` and
`train.advantage` (tests/test_algorithm_registry.py).
"""

from __future__ import annotations

import torch

from trainer.api import TrainConfig, register_advantage, register_loss

CALLS: list[int] = []  # the trained tokens of every micro-batch the loss saw


@register_loss("tallied-reinforce")
def tallied_reinforce(
    logprobs: torch.Tensor, mb: dict[str, torch.Tensor], cfg: TrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    mask = mb["loss_mask"].float()
    CALLS.append(int(mask.sum()))
    return -(logprobs * mb["advantages"] * mask).sum(), {"tally": float(len(CALLS))}


@register_advantage("above-half")
def above_half(batch: dict[str, torch.Tensor], cfg: TrainConfig) -> torch.Tensor:
    return batch["token_returns"] - 0.5
