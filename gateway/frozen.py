"""JSON values that cannot be changed: what the gateway's memos keep and share.

The memos (lru.HistoryMemo) hand a session's same message objects out turn after turn,
which is only safe if nobody changes them: a `FrozenDict` / `FrozenList` is a `dict` /
`list` whose mutating methods raise. Code that needs a change copies (`{**m, ...}`).
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(f"a {type(self).__name__} is shared by memos and cannot be changed; copy it")


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict whose contents cannot change."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:  # copy, deepcopy, pickle
        return type(self), (dict(self),)


class FrozenList(list):  # type: ignore[type-arg]
    """A list whose contents cannot change, made by `freeze` or `concat` only (so every
    item is frozen too)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[type, tuple[list[Any]]]:
        return type(self), (list(self),)

    @classmethod
    def concat(cls, head: FrozenList, tail: FrozenList) -> FrozenList:
        """`head` + `tail`, frozen both: a history grown by its new part, which alone
        was frozen (a long history is not walked again)."""
        if type(head) is not cls or type(tail) is not cls:
            raise TypeError("FrozenList.concat takes two FrozenLists")
        return cls([*head, *tail])


# kept as they are by `freeze`: scalars, and what it froze already
_KEEP = frozenset({str, int, float, bool, bytes, type(None), FrozenDict, FrozenList})


def freeze(value: Any) -> Any:
    """`value` (JSON) with every dict and list frozen; what is frozen is kept as it is, so
    re-freezing a history costs only its new parts. Not JSON: a TypeError."""
    kind = type(value)
    if kind in _KEEP:
        return value
    if kind is dict:
        out = FrozenDict(value)
        for key, item in value.items():
            if type(item) not in _KEEP:
                dict.__setitem__(out, key, freeze(item))
        return out
    if kind is list:
        return FrozenList([v if type(v) in _KEEP else freeze(v) for v in value])
    if kind is tuple:
        return tuple(v if type(v) in _KEEP else freeze(v) for v in value)
    if isinstance(value, (str, int, float, bytes)):  # a subclass (a str enum)
        return value
    raise TypeError(f"cannot freeze a {kind.__name__}: memos keep JSON values only")


def all_frozen(values: Any) -> bool:
    """Is every item of `values` frozen (a scalar, or a container `freeze` made)?"""
    return type(values) is FrozenList or _KEEP.issuperset(map(type, values))
