"""Agents and environments found by name: `register_agent` / `register_env`.

The trainer config names them (`agent: {name, args}`, `env: {name, args}`); the files
that register them are listed under `imports:`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from trainer.loading import import_file  # noqa: F401 - part of this module's API

if TYPE_CHECKING:
    from trainer.rollout.agent_env import Agent, EnvironmentService


class RegistryError(ValueError):
    pass


_AGENTS: dict[str, type] = {}
_ENVS: dict[str, type] = {}


def _same_definition(a: type, b: type) -> bool:
    """The same class imported twice (e.g. one file loaded under two module names)."""
    if a is b:
        return True
    fa = getattr(sys.modules.get(a.__module__), "__file__", None)
    fb = getattr(sys.modules.get(b.__module__), "__file__", None)
    return a.__qualname__ == b.__qualname__ and fa is not None and fa == fb


def _register(table: dict[str, type], kind: str, name: str, cls: type) -> type:
    if not isinstance(name, str) or not name:
        raise RegistryError(f"{kind} name must be a non-empty string, got {name!r}")
    if not isinstance(cls, type):
        raise RegistryError(f"register_{kind}({name!r}, ...) needs a class, got {cls!r}")
    old = table.get(name)
    if old is not None and not _same_definition(old, cls):
        raise RegistryError(
            f"{kind} {name!r} is already registered to {old.__module__}.{old.__qualname__}; "
            f"pick another name for {cls.__module__}.{cls.__qualname__}"
        )
    table[name] = cls
    return cls


def _make(table: dict[str, type], kind: str, name: str, args: dict[str, Any]) -> Any:
    cls = table.get(name)
    if cls is None:
        known = sorted(table) or "none"
        raise RegistryError(
            f"unknown {kind} {name!r}; registered {kind}s: {known} (is the file that "
            f"calls register_{kind} listed under `imports:`?)"
        )
    try:
        return cls(**args)
    except TypeError as exc:
        raise RegistryError(
            f"cannot build {kind} {name!r} ({cls.__name__}(**{args})): {exc}"
        ) from exc


def register_agent(name: str, cls: type) -> type:
    return _register(_AGENTS, "agent", name, cls)


def register_env(name: str, cls: type) -> type:
    return _register(_ENVS, "env", name, cls)


def make_agent(name: str, **args: Any) -> Agent:
    return _make(_AGENTS, "agent", name, args)


def make_env(name: str, **args: Any) -> EnvironmentService:
    return _make(_ENVS, "env", name, args)


def registered_agents() -> list[str]:
    return sorted(_AGENTS)


def registered_envs() -> list[str]:
    return sorted(_ENVS)
