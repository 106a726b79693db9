"""Rollouts that keep running while the trainer trains, at most `max_staleness` ahead.

Groups (one dataset row x `group_size` runs) start as long as
`started < (version + max_staleness + 1) * batch_size`, where `version` is the policy
version the trainer has published. With `max_staleness: 0` exactly one batch's groups
run per version: synchronous training. With 1, the next batch is already being
collected while the current one trains.

Groups are handed to training in the order they started, so group g trains at version
g // batch_size and started at version >= g // batch_size - max_staleness: no token is
more than `max_staleness` versions older than the weights it is trained against. (Taking
groups as they finish would let a slow group fall further behind.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from trainer.api.config import RolloutConfig
from trainer.rollout.agent_runner import Episode
from trainer.rollout.data_order import DataOrder

log = logging.getLogger(__name__)

RunGroup = Callable[[dict[str, Any], int, int], Awaitable[list[Episode]]]


class RolloutController:
    def __init__(
        self,
        run_group: RunGroup,
        rows: list[dict[str, Any]],
        order: DataOrder,
        config: RolloutConfig,
        version: int = 0,
    ) -> None:
        """`config`: the run's `rollout:` section (batch and group size, staleness bound);
        `version`: the policy version training resumes at."""
        if config.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {config.max_staleness}")
        if config.batch_size <= 0 or config.group_size <= 0:
            raise ValueError("rollout.batch_size and rollout.group_size must be positive")
        self.run_group = run_group
        self.rows = rows
        self.order = order
        self.batch_size = config.batch_size
        self.group_size = config.group_size
        self.max_staleness = config.max_staleness
        self.version = version
        # groups consumed before a resume count as started
        self.started = version * self.batch_size
        # started groups, in start order, each with the task that runs it
        self._started: asyncio.Queue[tuple[int, asyncio.Task[list[Episode]]]] = asyncio.Queue()
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[list[Episode]]] = set()
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
        """The next `batch_size` groups in start order, as (group index, episodes)."""
        out = []
        while len(out) < self.batch_size:
            group, task = await self._wait(self._started.get())
            episodes = await self._wait(asyncio.shield(task))
            self.order.consumed(group)
            out.append((group, episodes))
        return out

    async def _wait(self, aw: Any) -> Any:
        """Await `aw`, but re-raise a producer crash instead of hanging."""
        fut = asyncio.ensure_future(aw)
        if self._producer is None:
            return await fut
        await asyncio.wait({fut, self._producer}, return_when=asyncio.FIRST_COMPLETED)
        if fut.done():
            return fut.result()
        fut.cancel()
        self._producer.result()
        raise RuntimeError("the rollout producer stopped")

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
            self._started.put_nowait((group, task))

    async def _run(self, group: int, data: dict[str, Any]) -> list[Episode]:
        try:
            return await self.run_group(data, group, self.group_size)
        except Exception as exc:  # a runner bug must not stall training
            log.exception("rollout group %d failed", group)
            return [Episode(group=group, session_id="", error=f"{type(exc).__name__}: {exc}")]
