"""Weights & Biases. `mode: offline` (the default here) writes the run under
<run_dir>/wandb and sends nothing; `wandb sync` uploads it later."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.trackers.base import needs, register_tracker


class WandbTracker:
    def __init__(self, run_dir: Path, options: dict[str, Any], config: dict[str, Any]) -> None:
        wandb = needs("wandb", "wandb")
        options = {"mode": "offline", "dir": str(run_dir), "name": run_dir.name, **options}
        self._run = wandb.init(config=config, **options)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


@register_tracker("wandb")
def make(run_dir: Path, options: dict[str, Any], config: dict[str, Any], start_step: int):
    return WandbTracker(run_dir, options, config)
