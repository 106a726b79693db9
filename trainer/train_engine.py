"""The training-backend interface that user-written algorithms program against.

An algorithm (REINFORCE, ReMax, a custom PPO) is a loss function over packed 1-D
tensors plus a weight per micro-batch; the backend owns packing, data parallelism,
gradient accumulation and the optimizer. Subclass a backend (`DeepSpeedEngine`) and
add your algorithm's method, e.g. `train_reinforce(batch)`, then name the subclass in
`train.engine_class` and the method in `train.step_method`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# loss_fn(logits (T, V) float32, micro_batch) -> scalar loss for that micro-batch
LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
# loss_weight_fn(micro_batch) -> its weight, e.g. its number of trained tokens
LossWeightFn = Callable[[dict[str, torch.Tensor]], Any]


class TrainEngine(abc.ABC):
    @abc.abstractmethod
    def train_batch(
        self, data: dict[str, torch.Tensor], loss_fn: LossFn, loss_weight_fn: LossWeightFn
    ) -> dict[str, float]:
        """One optimizer step on a padded batch (B, L) with an `attention_mask`.

        The batch is unpadded and packed into micro-batches; the step minimises
        sum_mb loss_fn(mb) * w(mb) / sum_mb w(mb).
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

    def step_lr_scheduler(self) -> None:  # noqa: B027 - optional hook
        """Advance the learning-rate schedule, where there is one."""

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
