"""The one interface every experiment tracker implements, and the table of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gateway.registry import Registry, RegistryError


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
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise TrackerError(
            f"the {backend!r} tracker needs the {package!r} package: pip install {package}"
        ) from exc
