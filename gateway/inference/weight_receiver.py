"""An engine's side of a weight push, for the gateway's admin routes (entrypoints/weights.py).

The embedded engine holds its rank in the gateway process and receives in a thread, off
the event loop; vLLM's workers hold theirs (vllm_worker_extension.py), and a push there
is a load inside the engine's pause/resume update, so per-token versions stay exact.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gateway.inference.base import EngineError, InferenceEngine, WeightUpdate
from gateway.inference.vllm import VLLMEngine
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
        tensors = receive(self._group, manifest, self.engine.device)
        state_dict = await asyncio.to_thread(dict, tensors)  # the broadcast runs there
        return await self.engine.update_weights(WeightUpdate(version, state_dict=state_dict))

    async def leave(self) -> None:
        group, self._group = self._group, None
        self.group_id = ""
        if group is not None:
            group.shutdown()


class VLLMWeightReceiver:
    """The vLLM engine's side of a push: its servers' workers hold the ranks."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self._workers: dict[str, int] = {}  # server -> worker count
        self.group_id = ""

    @property
    def _servers(self) -> list[str]:
        return list(self.engine.update_urls or self.engine.urls)

    async def devices(self) -> list[str]:
        """One rank per worker of each server, in rank order: each worker's device."""
        out: list[str] = []
        for url in self._servers:
            results = await self.engine.collective_rpc(url, "turnstile_weight_device")
            self._workers[url] = len(results)
            out += [str(device) for _, device in sorted(results)]
        return out

    async def join(self, spec: GroupSpec, first_rank: int) -> None:
        if not self._workers:
            await self.devices()
        calls = []
        for url in self._servers:
            kwargs = {"group": spec.to_json(), "first_rank": first_rank}
            method = "turnstile_join_weight_group"
            calls.append(self.engine.collective_rpc(url, method, kwargs, spec.timeout_s))
            first_rank += self._workers[url]
        await asyncio.gather(*calls)
        self.group_id = spec.group_id

    async def receive(self, version: int, manifest: Manifest) -> int:
        kwargs = {"group_id": self.group_id, "manifest": manifest.to_json()}
        return await self.engine.update_weights_with(
            lambda url, new, _abort: self.engine.load_with(
                url, "turnstile_receive_weights", kwargs, new
            ),
            version,
            f"a push (group {self.group_id})",
        )

    async def leave(self) -> None:
        leave = "turnstile_leave_weight_group"
        await asyncio.gather(*(self.engine.collective_rpc(u, leave) for u in self._servers))
        self.group_id = ""


def receiver_for(engine: InferenceEngine) -> WeightReceiver:
    """The receiver of an engine kind; EngineError for a kind that takes no push."""
    from gateway.inference.embedded import EmbeddedEngine

    if isinstance(engine, EmbeddedEngine):
        return EmbeddedReceiver(engine)
    if isinstance(engine, VLLMEngine):
        return VLLMWeightReceiver(engine)
    raise EngineError(
        f"the {engine.name!r} engine takes no weight push: load a folder instead "
        "(POST /admin/weights with a path)"
    )
