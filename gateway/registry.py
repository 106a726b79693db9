"""Things users add by name (engines, tool parsers, export styles, losses, agents): one kind
of table for all of them.

`@TABLE.register("name")` adds an object; `TABLE.lookup(name)` finds it or raises an error
that lists what is registered. A name registered twice is an error, unless it is the
same definition imported twice (one file loaded under two module names).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    pass


def _origin(obj: Any) -> tuple[str | None, str | None]:
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return getattr(obj, "__qualname__", None), getattr(module, "__file__", None)


def same_definition(a: Any, b: Any) -> bool:
    if a is b or a == b:
        return True
    qa, fa = _origin(a)
    return qa is not None and fa is not None and (qa, fa) == _origin(b)


def describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(dict[str, T]):
    """A name -> object table with clear errors; a dict, so `sorted(table)` lists it."""

    def __init__(
        self, kind: str, plural: str | None = None, *, error: type[Exception] = RegistryError
    ) -> None:
        super().__init__()
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self.error = error

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@TABLE.register("name")`."""
        return lambda obj: self.add(name, obj)

    def add(self, name: str, obj: T) -> T:
        if not isinstance(name, str) or not name:
            raise self.error(f"a {self.kind} name must be a non-empty string, got {name!r}")
        old = self.get(name)
        if old is not None and not same_definition(old, obj):
            raise self.error(
                f"{self.kind} {name!r} is already registered to {describe(old)}; "
                f"pick another name for {describe(obj)}"
            )
        self[name] = obj
        return obj

    def lookup(self, name: str, hint: str = "") -> T:
        if name not in self:
            known = sorted(self) or "none"
            raise self.error(
                f"unknown {self.kind} {name!r}; registered {self.plural}: {known}{hint}"
            )
        return self[name]
