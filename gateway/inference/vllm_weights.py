"""A weight push into vLLM servers, through our worker extension and `/collective_rpc`.

Each server's workers join the trainer's group (vllm_worker_extension.py); a push
then runs inside the engine's update protocol (remote.py `update_weights_with`):
every server paused (what it generates comes back aborted and is resubmitted after),
each worker receiving and loading the tensors, the prefix cache reset, the weight
version set, every server resumed. Tokens made before the push keep the old version,
tokens after it carry the new one, as with a reload from disk.
"""

from __future__ import annotations

import asyncio

from gateway.inference.vllm import EXTENSION, VLLMEngine
from gateway.inference.weight_broadcast import GroupSpec, Manifest

__all__ = ["EXTENSION", "VLLMWeightReceiver"]


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
            results = await self.engine.collective_rpc(url, "turnstile_weight_device", {})
            self._workers[url] = len(results)
            out += [str(device) for _, device in sorted(results)]
        return out

    async def join(self, spec: GroupSpec, first_rank: int) -> None:
        if not self._workers:
            await self.devices()
        calls = []
        rank = first_rank
        for url in self._servers:
            kwargs = {"group": spec.to_json(), "first_rank": rank}
            calls.append(
                self.engine.collective_rpc(
                    url, "turnstile_join_weight_group", kwargs, spec.timeout_s
                )
            )
            rank += self._workers[url]
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
        await asyncio.gather(
            *(
                self.engine.collective_rpc(u, "turnstile_leave_weight_group", {})
                for u in self._servers
            )
        )
        self.group_id = ""
