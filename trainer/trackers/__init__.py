"""Experiment trackers: one interface, backends chosen by name in the YAML.

    trackers:
      backends: [tensorboard, wandb, trackio]
      wandb: {project: my-project, mode: offline}
      trackio: {project: my-project}

Importing this package imports no tracker library: each backend imports its own when
it is made, so an unused one need not be installed.
"""

from trainer.trackers import tensorboard, trackio, wandb  # noqa: E402,F401  (register)
from trainer.trackers.base import TRACKERS, Tracker, make_trackers, register_tracker

__all__ = ["TRACKERS", "Tracker", "make_trackers", "register_tracker"]
