"""Which dataset row each rollout group gets, reproducibly across a resume.

Group k (counted from the start of the run) gets row `order(epoch)[k % n]`, where each
epoch's order is a fixed shuffle of the seed and the epoch. Training consumes groups as
they finish, which under async rollouts is not in order, so the state to save is the
set of consumed groups: a low-water mark plus the few consumed above it.
"""

from __future__ import annotations

import functools
import random
from typing import Any


@functools.lru_cache(maxsize=1)
def _epoch_order(seed: int, num_rows: int, epoch: int) -> list[int]:
    order = list(range(num_rows))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


class DataOrder:
    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows <= 0:
            raise ValueError("the dataset is empty")
        self.num_rows = num_rows
        self.seed = seed
        self.low = 0  # every group below this was consumed by training
        self.consumed_above: set[int] = set()
        self._next = 0  # next group index to hand out

    def row(self, group: int) -> int:
        epoch, pos = divmod(group, self.num_rows)
        return _epoch_order(self.seed, self.num_rows, epoch)[pos]

    def next_group(self) -> int:
        """The next group not yet consumed (in-flight groups lost to a crash come again)."""
        k = max(self._next, self.low)
        while k in self.consumed_above:
            k += 1
        self._next = k + 1
        return k

    def consumed(self, group: int) -> None:
        self.consumed_above.add(group)
        while self.low in self.consumed_above:
            self.consumed_above.discard(self.low)
            self.low += 1

    def state(self) -> dict[str, Any]:
        return {
            "low": self.low,
            "consumed_above": sorted(self.consumed_above),
            "seed": self.seed,
            "num_rows": self.num_rows,
        }

    def load(self, state: dict[str, Any]) -> None:
        if state.get("num_rows") != self.num_rows or state.get("seed") != self.seed:
            raise ValueError(
                "cannot resume: the checkpoint was made with a different dataset size or seed "
                f"({state.get('num_rows')} rows, seed {state.get('seed')}; now "
                f"{self.num_rows} rows, seed {self.seed})"
            )
        self.low = int(state["low"])
        self.consumed_above = set(state.get("consumed_above", []))
        self._next = self.low
