"""Rollouts that keep running while the trainer trains, at most `max_staleness` ahead.

Groups (one dataset row x `group_size` runs) start as long as
`started < (version + max_staleness + 1) * batch_size`, where `version` is the policy
version the trainer has published. With `max_staleness: 0` exactly one batch's groups
run per version: synchronous training. With 1, the next batch is already being
collected while the current one trains, and no token comes from weights more than one
update older than those it is trained against. Finished groups are handed to training
in the order they finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from trainer.data_order import DataOrder
from trainer.rollout import Episode

log = logging.getLogger(__name__)

RunGroup = Callable[[dict[str, Any], int, int], Awaitable[list[Episode]]]


class RolloutController:
    def __init__(
        self,
        run_group: RunGroup,
        rows: list[dict[str, Any]],
        order: DataOrder,
        *,
        batch_size: int,
        group_size: int,
        max_staleness: int,
        version: int = 0,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {max_staleness}")
        if batch_size <= 0 or group_size <= 0:
            raise ValueError("rollout.batch_size and rollout.group_size must be positive")
        self.run_group = run_group
        self.rows = rows
        self.order = order
        self.batch_size = batch_size
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.version = version
        # groups consumed before a resume count as started
        self.started = version * batch_size
        self._done: asyncio.Queue[tuple[int, list[Episode]]] = asyncio.Queue()
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._producer: asyncio.Task[None] | None = None

    def capacity(self) -> int:
        return (self.version + self.max_staleness + 1) * self.batch_size - self.started

    def start(self) -> None:
        self._producer = asyncio.create_task(self._produce(), name="rollout-producer")

    async def set_version(self, version: int) -> None:
        async with self._cond:
            self.version = version
            self._cond.notify_all()

    async def next_batch(self) -> list[tuple[int, list[Episode]]]:
        """The next `batch_size` finished groups, as (group index, episodes)."""
        out = []
        while len(out) < self.batch_size:
            if self._producer is not None and self._producer.done():
                self._producer.result()  # re-raise a producer crash instead of hanging
            getter = asyncio.ensure_future(self._done.get())
            waiters: set[asyncio.Future[Any]] = {getter}
            if self._producer is not None:
                waiters.add(self._producer)
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            group, episodes = getter.result()
            self.order.consumed(group)
            out.append((group, episodes))
        return out

    async def stop(self) -> None:
        tasks = [t for t in (self._producer, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _produce(self) -> None:
        while True:
            async with self._cond:
                await self._cond.wait_for(lambda: self.capacity() > 0)
                self.started += 1
            group = self.order.next_group()
            data = self.rows[self.order.row(group)]
            task = asyncio.create_task(self._run(group, data), name=f"group-{group}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, group: int, data: dict[str, Any]) -> None:
        try:
            episodes = await self.run_group(data, group, self.group_size)
        except Exception as exc:  # a runner bug must not stall training
            log.exception("rollout group %d failed", group)
            episodes = [Episode(group=group, session_id="", error=f"{type(exc).__name__}: {exc}")]
        await self._done.put((group, episodes))
