"""TensorBoard event files under <run_dir>/tensorboard (tensorboardX, no TensorFlow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.trackers.base import needs, register_tracker


class TensorBoardTracker:
    def __init__(self, run_dir: Path, options: dict[str, Any], start_step: int) -> None:
        tbx = needs("tensorboardX", "tensorboard")
        log_dir = options.get("log_dir") or run_dir / "tensorboard"
        # purge_step drops events a crashed run wrote past its last checkpoint
        self._writer = tbx.SummaryWriter(
            str(log_dir), purge_step=start_step + 1 if start_step else None
        )

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


@register_tracker("tensorboard")
def make(run_dir: Path, options: dict[str, Any], config: dict[str, Any], start_step: int):
    return TensorBoardTracker(run_dir, options, start_step)
