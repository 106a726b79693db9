"""Training algorithms: the built-in actor and the registries of losses and advantages.

Import from here. A new loss is one function decorated with `@register_loss("name")`,
a new advantage estimator one with `@register_advantage("name")`; select them with
`train.loss` and `train.advantage` (put the file in the config's `imports:`).
"""

from trainer.algorithm.actor import PPOActor, to_sequences
from trainer.algorithm.advantages import get_advantage, register_advantage
from trainer.algorithm.losses import get_loss, register_loss

__all__ = [
    "PPOActor",
    "get_advantage",
    "get_loss",
    "register_advantage",
    "register_loss",
    "to_sequences",
]
