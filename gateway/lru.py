"""A size-bounded, least-recently-used map for every cache that grows with traffic (but
the ASCII encoder's pre-tokens, looked up hundreds of times a request).

Bounded by entries and, where entries differ in size, by total weight. `group` names a
key's session, whose entries go at once when it ends (`drop_group`): the caches hold
only live sessions' state (docs/benchmarks.md, rss).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from gateway.frozen import all_frozen, freeze

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(
        self,
        max_entries: int,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
        group: Callable[[K], Hashable] | None = None,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"an LRU cache needs room for at least 1 entry, got {max_entries}")
        if (max_weight is None) != (weigh is None):
            raise ValueError("max_weight and weigh go together")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh
        self.weight = 0
        self._data: OrderedDict[K, V] = OrderedDict()
        self._group = group
        self._groups: dict[Hashable, set[K]] = {}  # group -> its keys (with `group`)

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self.pop(key)
        self._data[key] = value
        if self._weigh is not None:
            self.weight += self._weigh(value)
        if self._group is not None:
            self._groups.setdefault(self._group(key), set()).add(key)
        while len(self._data) > self.max_entries or (
            self.max_weight is not None and self.weight > self.max_weight and self._data
        ):
            self._removed(*self._data.popitem(last=False))

    def pop(self, key: K) -> V | None:
        value = self._data.pop(key, None)
        if value is not None:
            self._removed(key, value)
        return value

    def drop_group(self, group: Hashable) -> None:
        """Forget every entry whose key is in `group` (needs `group` at construction)."""
        for key in list(self._groups.get(group, ())):
            self.pop(key)

    def _removed(self, key: K, value: V) -> None:
        if self._weigh is not None:
            self.weight -= self._weigh(value)
        if self._group is not None:
            keys = self._groups[g := self._group(key)]
            keys.discard(key)
            if not keys:
                del self._groups[g]

    def items(self) -> list[tuple[K, V]]:
        return list(self._data.items())

    def __len__(self) -> int:
        return len(self._data)


class HistoryMemo(Generic[V]):
    """What was computed from a history, kept so that its next, longer version (an
    agent's next body holds the same message objects) computes only its new part. Keyed
    by the first message's id, holding the messages as a tuple (their ids stay theirs).
    Only a frozen history is kept, its value frozen too: that the same objects mean the
    same messages is enforced, not promised."""

    def __init__(self, histories: int) -> None:
        self.histories: LRU[int, tuple[tuple[Any, ...], V]] = LRU(max(1, histories))

    def get(self, messages: Sequence[Any]) -> tuple[int, V] | None:
        """(how many of `messages` the kept value is of, the value), when a history kept
        is `messages` or starts it, object for object."""
        if not messages:
            return None
        hit = self.histories.get(id(messages[0]))
        if hit is None:
            return None
        seen, value = hit
        if len(seen) > len(messages) or not all(map(operator.is_, seen, messages)):
            return None
        return len(seen), value

    def put(self, messages: Sequence[Any], value: V) -> V:
        """Keep `value` for `messages` if they are frozen; returns it frozen (the
        caller hands on that one, which a later `get` returns), or as it is if not kept."""
        if not messages or not all_frozen(messages):
            return value
        value = freeze(value)
        self.histories.put(id(messages[0]), (tuple(messages), value))
        return value
