"""The training-backend contract, and the one call every algorithm trains through.

An algorithm is a loss over one packed micro-batch plus a weight per micro-batch; the
backend owns packing, data parallelism, gradient accumulation and the optimizer. The
built-in actor makes the same `train_batch` call as a user's algorithm (as in AReaL),
so there is one training path. A whole algorithm of your own: a backend subclass with
a method calling `self.train_batch` (`train.engine_class`, `train.step_method`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# loss_fn(logits, micro_batch) -> the micro-batch's loss, or (loss, stats to report).
# logits are (T, V) float32, or (K, V) for the K positions of `logits_mask` (see
# `TrainEngine.train_batch`).
LossFn = Callable[
    [torch.Tensor, dict[str, torch.Tensor]],
    torch.Tensor | tuple[torch.Tensor, dict[str, float]],
]
# loss_weight_fn(micro_batch) -> its weight, e.g. its number of trained tokens
LossWeightFn = Callable[[dict[str, torch.Tensor]], Any]


class TrainEngine(abc.ABC):
    @abc.abstractmethod
    def train_batch(
        self, data: dict[str, torch.Tensor], loss_fn: LossFn, loss_weight_fn: LossWeightFn
    ) -> dict[str, float]:
        """One optimizer step on a padded batch (B, L) with an `attention_mask`.

        The batch is unpadded and packed into micro-batches (`backend/batches.py`) on the
        model's device; the step minimises sum_mb loss_fn(logits, mb) * w(mb) / sum_mb
        w(mb), and averages the stats a loss returns with the same weights. With a large
        vocabulary only the logits a loss reads should pay for the LM head: when the
        batch holds a per-token bool `logits_mask`, only those positions go through it
        and `loss_fn` gets their logits, (K, V) in order (`next_token_logprobs` reads
        either form).
        """

    @abc.abstractmethod
    def eval_batch(
        self, data: dict[str, torch.Tensor], loss_fn: LossFn, loss_weight_fn: LossWeightFn
    ) -> float:
        """The same weighted loss, without gradients or an update."""

    def train(self, mode: bool = True) -> TrainEngine:  # noqa: B027 - optional hook
        """Put the model in training mode (dropout etc.)."""
        return self

    def eval(self) -> TrainEngine:
        return self.train(False)

    @abc.abstractmethod
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Whole weights (gathered when partitioned), e.g. for the inference engine."""

    @abc.abstractmethod
    def save_hf(self, path: Path, tokenizer: Any = None) -> Path:
        """A Hugging Face folder any engine can load."""

    @abc.abstractmethod
    def save_checkpoint(self, path: Path, client_state: dict[str, Any]) -> None:
        """Weights, optimizer and `client_state` (step, data order), for resuming."""

    @abc.abstractmethod
    def load_checkpoint(self, path: Path) -> dict[str, Any] | None:
        """Restore the newest checkpoint under `path`; its client_state, or None."""
