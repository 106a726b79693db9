"""Everything user code registers by name, and the config key that then chooses it.

    @register_loss("name")           train.loss: name              (trainer/algorithm/losses.py)
    @register_advantage("name")      train.advantage: name         (trainer/algorithm/advantages.py)
    @register_export_style("name")   rollout.agent.export_style    (gateway/samples/)
    register_agent("name", Class)    agent: {name: ..., args: {...}}
    register_env("name", Class)      env: {name: ..., args: {...}}

The built-in losses and estimators register in the modules named above; a file that
registers your own goes under the config's `imports:`. No torch here, so an agent file
that registers an environment stays light in a `mode: subproc` worker.

A loss `fn(logprobs, mb, cfg)` gets the logprobs (T,) of every token under the policy
being trained, a packed micro-batch `mb` of per-token (T,) tensors (`input_ids`,
`loss_mask`, behaviour `logprobs`, `versions`, `advantages`, and `prox_logprobs` when
tokens are stale) and the `TrainConfig`. It returns the SUM over trained tokens and
stats: the actor divides by the step's trained tokens, so every token weighs the same
however the step was split into micro-batches.

An advantage estimator `fn(batch, cfg)` gets one step's padded batch: (B,) `returns` and
`group` (the dataset row), (B, L) `token_returns` (each token's own return: the scalar
return unless a concat export gave per-turn ones), `loss_mask`, ...; and the
`TrainConfig`. It returns every token's advantage (B, L); masked tokens are ignored, and
samples with no nonzero advantage are not trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.registry import Registry, RegistryError
from gateway.samples.registry import register_export_style
from trainer.api.config import ConfigError, TrainConfig

if TYPE_CHECKING:
    import torch

    from trainer.api.agent import Agent, EnvironmentService

__all__ = [
    "ESTIMATORS",
    "LOSSES",
    "Estimator",
    "Loss",
    "LossResult",
    "RegistryError",
    "make_agent",
    "make_env",
    "register_advantage",
    "register_agent",
    "register_env",
    "register_export_style",
    "register_loss",
]

LossResult = tuple["torch.Tensor", dict[str, float]]  # (sum over trained tokens, stats)
Loss = Callable[["torch.Tensor", dict[str, "torch.Tensor"], TrainConfig], LossResult]
Estimator = Callable[[dict[str, "torch.Tensor"], TrainConfig], "torch.Tensor"]

LOSSES: Registry[Loss] = Registry("train.loss", "losses", error=ConfigError)
register_loss = LOSSES.register
ESTIMATORS: Registry[Estimator] = Registry("train.advantage", "estimators", error=ConfigError)
register_advantage = ESTIMATORS.register

_AGENTS: Registry[type] = Registry("agent")
_ENVS: Registry[type] = Registry("env")
_HINT = " (is the file that registers it listed under `imports:`?)"


def _register(table: Registry[type], name: str, cls: type) -> type:
    if not isinstance(cls, type):
        raise RegistryError(f"register_{table.kind}({name!r}, ...) needs a class, got {cls!r}")
    return table.add(name, cls)


def _make(table: Registry[type], name: str, args: dict[str, Any]) -> Any:
    cls = table.lookup(name, _HINT)
    try:
        return cls(**args)
    except TypeError as exc:
        raise RegistryError(
            f"cannot build {table.kind} {name!r} ({cls.__name__}(**{args})): {exc}"
        ) from exc


def register_agent(name: str, cls: type) -> type:
    return _register(_AGENTS, name, cls)


def register_env(name: str, cls: type) -> type:
    return _register(_ENVS, name, cls)


def make_agent(name: str, **args: Any) -> Agent:
    return _make(_AGENTS, name, args)


def make_env(name: str, **args: Any) -> EnvironmentService:
    return _make(_ENVS, name, args)
