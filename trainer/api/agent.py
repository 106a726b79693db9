"""The two interfaces of the queue-based agent API: the agent and its environment."""

from __future__ import annotations

import abc
import asyncio
from typing import Any


class EnvironmentService(abc.ABC):
    """An async gym-style environment. One instance serves all concurrent episodes."""

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Start an episode; returns (observation, info)."""
        return None, {}

    @abc.abstractmethod
    async def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Returns (observation, reward, terminated, truncated, info)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass


class Agent(abc.ABC):
    @abc.abstractmethod
    async def collect_trajectory(
        self,
        prompt: dict[str, Any],
        env: EnvironmentService,
        obs_queue: asyncio.Queue,
        act_queue: asyncio.Queue,
    ) -> list[dict[str, Any]]:
        """Play one episode for the dataset row `prompt` (it has a unique "qid")."""
