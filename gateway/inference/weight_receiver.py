"""An engine's side of a weight push: the ranks it takes and their devices, joining,
receiving.

The gateway's admin routes (entrypoints/weights.py) call these; which receiver an
engine gets is decided here, once. The embedded engine holds its rank in the gateway
process and loads what arrives between two decode steps; vLLM's workers hold theirs
(vllm_weights.py). Receiving blocks on the trainer's broadcast, so it runs in a
thread, off the event loop that keeps serving requests.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import torch

from gateway.inference.base import EngineError, InferenceEngine, WeightUpdate
from gateway.inference.weight_broadcast import (
    GroupSpec,
    Manifest,
    device_id,
    open_group,
    receive,
)


class WeightReceiver(Protocol):
    group_id: str

    async def devices(self) -> list[str]:
        """The device (`device_id`) of each rank this engine holds in the trainer's group:
        the trainer picks the group's backend from them."""

    async def join(self, spec: GroupSpec, first_rank: int) -> None:
        """Take ranks first_rank.. of the group; returns once all ranks have joined."""

    async def receive(self, version: int, manifest: Manifest) -> int:
        """Receive one push, serve it from now on; returns the new policy version."""

    async def leave(self) -> None:
        """Leave the group (a later join replaces it anyway)."""


class EmbeddedReceiver:
    """The embedded engine's rank, in the gateway process."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.group_id = ""
        self._group: Any = None

    async def devices(self) -> list[str]:
        return [device_id(self.engine.device)]

    async def join(self, spec: GroupSpec, first_rank: int) -> None:
        await self.leave()
        self._group = await asyncio.to_thread(open_group, spec, first_rank, self.engine.device)
        self.group_id = spec.group_id

    async def receive(self, version: int, manifest: Manifest) -> int:
        group = self._group

        def take() -> dict[str, torch.Tensor]:
            return dict(receive(group, manifest, self.engine.device))

        state_dict = await asyncio.to_thread(take)
        return await self.engine.update_weights(WeightUpdate(version, state_dict=state_dict))

    async def leave(self) -> None:
        group, self._group = self._group, None
        self.group_id = ""
        if group is not None:
            group.shutdown()


def receiver_for(engine: InferenceEngine) -> WeightReceiver:
    """The receiver of an engine kind; EngineError for a kind that takes no push."""
    from gateway.inference.embedded import EmbeddedEngine
    from gateway.inference.vllm import VLLMEngine

    if isinstance(engine, EmbeddedEngine):
        return EmbeddedReceiver(engine)
    if isinstance(engine, VLLMEngine):
        from gateway.inference.vllm_weights import VLLMWeightReceiver

        return VLLMWeightReceiver(engine)
    raise EngineError(
        f"the {engine.name!r} engine takes no weight push: load a folder instead "
        "(POST /admin/weights with a path)"
    )
