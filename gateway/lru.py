"""A size-bounded, least-recently-used map: every cache that grows with traffic uses one,
except the ASCII encoder's pre-tokens (gateway/chat/ascii_encoder.py), looked up hundreds
of times a request, where two generations of plain dicts stand in for it.

Bounded by entries and, where entries differ in size (a long session's parent holds its
whole prompt), also by their total weight: whichever bound is hit first evicts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(
        self,
        max_entries: int,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
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
        while len(self._data) > self.max_entries or (
            self.max_weight is not None and self.weight > self.max_weight and self._data
        ):
            _, old = self._data.popitem(last=False)
            self._unweigh(old)

    def pop(self, key: K) -> V | None:
        value = self._data.pop(key, None)
        if value is not None:
            self._unweigh(value)
        return value

    def _unweigh(self, value: V) -> None:
        if self._weigh is not None:
            self.weight -= self._weigh(value)

    def items(self) -> list[tuple[K, V]]:
        return list(self._data.items())

    def __len__(self) -> int:
        return len(self._data)
