"""trackio (Hugging Face's local-first tracker): runs go to its local database (by
default under ~/.cache/huggingface/trackio, or $TRACKIO_DIR) and `trackio show` opens
them; nothing leaves the machine unless `space_id` is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.trackers.base import needs, register_tracker


class TrackioTracker:
    def __init__(self, run_dir: Path, options: dict[str, Any], config: dict[str, Any]) -> None:
        self._trackio = needs("trackio", "trackio")
        options = {"project": "turnstile", "name": run_dir.name, **options}
        self._run = self._trackio.init(config=config, **options)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._trackio.log(scalars, step=step)

    def close(self) -> None:
        self._trackio.finish()


@register_tracker("trackio")
def make(run_dir: Path, options: dict[str, Any], config: dict[str, Any], start_step: int):
    return TrackioTracker(run_dir, options, config)
