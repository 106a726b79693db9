"""Turnstile trainer: `Trainer(config).train(workflow="my_module.MyAgent")`."""

from __future__ import annotations

from typing import Any

__all__ = ["Trainer", "TrainerConfig", "load_config"]


def __getattr__(name: str) -> Any:
    # Lazy, so `turnstile serve` does not pay for importing DeepSpeed.
    if name == "Trainer":
        from trainer.trainer import Trainer

        return Trainer
    if name in ("TrainerConfig", "load_config"):
        from trainer.api import config

        return getattr(config, name)
    raise AttributeError(name)
