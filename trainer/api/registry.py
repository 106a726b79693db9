"""Agents and environments found by name: `register_agent` / `register_env`.

The trainer config names them (`agent: {name, args}`, `env: {name, args}`); the files
that register them are listed under `imports:`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.registry import Registry, RegistryError
from trainer.loading import import_file  # noqa: F401 - part of this module's API

if TYPE_CHECKING:
    from trainer.rollout.agent_env import Agent, EnvironmentService

__all__ = ["RegistryError", "make_agent", "make_env", "register_agent", "register_env"]

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


def registered_agents() -> list[str]:
    return sorted(_AGENTS)


def registered_envs() -> list[str]:
    return sorted(_ENVS)
