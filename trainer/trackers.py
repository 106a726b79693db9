"""Experiment trackers: one interface, backends chosen by name in the YAML.

    trackers:
      backends: [tensorboard, wandb, trackio]
      wandb: {project: my-project, mode: offline}
      trackio: {project: my-project}

Importing this module imports no tracker library: each backend imports its own when it
is made, so an unused one need not be installed. A backend is a class registered by name
whose constructor takes (run_dir, options, config, start_step).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gateway.registry import Registry, RegistryError

__all__ = ["TRACKERS", "Tracker", "TrackerError", "make_trackers", "register_tracker"]


class Tracker(Protocol):
    """Receives what the run log writes: a step's scalars, grouped as `group/name`."""

    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


# name -> factory(run_dir, options, config, start_step) -> Tracker
TrackerFactory = Callable[[Path, dict[str, Any], dict[str, Any], int], Tracker]


class TrackerError(RegistryError):
    pass


TRACKERS: Registry[TrackerFactory] = Registry("tracker", error=TrackerError)
register_tracker = TRACKERS.register


def make_trackers(
    backends: list[str],
    options: dict[str, dict[str, Any]],
    run_dir: Path,
    config: dict[str, Any] | None = None,
    start_step: int = 0,
) -> list[Tracker]:
    """The trackers named in `backends`, each given `options[name]`; `config` is the
    run's configuration (trackers that keep one store it), `start_step` the steps a
    resumed run already logged."""
    factories = [TRACKERS.lookup(name) for name in backends]  # all known, before any starts
    return [
        factory(run_dir, dict(options.get(name) or {}), config or {}, start_step)
        for name, factory in zip(backends, factories, strict=True)
    ]


def needs(package: str, backend: str) -> Any:
    """Import a tracker's library, or say how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise TrackerError(
            f"the {backend!r} tracker needs the {package!r} package: pip install {package}"
        ) from exc


@register_tracker("tensorboard")
class TensorBoardTracker:
    """Event files under <run_dir>/tensorboard (tensorboardX, no TensorFlow)."""

    def __init__(self, run_dir: Path, options: dict[str, Any], config: Any, start_step: int):
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


@register_tracker("wandb")
class WandbTracker:
    """Weights & Biases. `mode: offline` (the default here) writes the run under
    <run_dir>/wandb and sends nothing; `wandb sync` uploads it later."""

    def __init__(self, run_dir: Path, options: dict[str, Any], config: Any, start_step: int):
        wandb = needs("wandb", "wandb")
        options = {"mode": "offline", "dir": str(run_dir), "name": run_dir.name, **options}
        self._run = wandb.init(config=config, **options)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


@register_tracker("trackio")
class TrackioTracker:
    """trackio (Hugging Face's local-first tracker): runs go to its local database (by
    default under ~/.cache/huggingface/trackio, or $TRACKIO_DIR) and `trackio show` opens
    them; nothing leaves the machine unless `space_id` is given."""

    def __init__(self, run_dir: Path, options: dict[str, Any], config: Any, start_step: int):
        self._trackio = needs("trackio", "trackio")
        options = {"project": "turnstile", "name": run_dir.name, **options}
        self._run = self._trackio.init(config=config, **options)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self._trackio.log(scalars, step=step)

    def close(self) -> None:
        self._trackio.finish()
