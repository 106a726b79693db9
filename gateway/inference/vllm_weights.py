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
from typing import Any

import httpx

from gateway import json_codec
from gateway.inference.base import EngineError
from gateway.inference.vllm import DEV_MODE_HINT, EXTENSION, EXTENSION_HINT, VLLMEngine
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
            results = await self._rpc(url, "turnstile_weight_device", {})
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
            calls.append(self._rpc(url, "turnstile_join_weight_group", kwargs, spec.timeout_s))
            rank += self._workers[url]
        await asyncio.gather(*calls)
        self.group_id = spec.group_id

    async def receive(self, version: int, manifest: Manifest) -> int:
        group_id = self.group_id

        async def load(url: str, new: int, abort: bool) -> str | None:
            try:
                await self._rpc(
                    url,
                    "turnstile_receive_weights",
                    {"group_id": group_id, "manifest": manifest.to_json()},
                )
                # no KV of the old weights is reused; tokens from now on say `new`
                await self._call(url, "/reset_prefix_cache", {})
                await self._call(url, "/update_weight_version", {"new_version": str(new)})
            except EngineError as exc:
                return str(exc)
            return None

        return await self.engine.update_weights_with(load, version, f"a push (group {group_id})")

    async def leave(self) -> None:
        await asyncio.gather(
            *(self._rpc(u, "turnstile_leave_weight_group", {}) for u in self._servers)
        )
        self.group_id = ""

    async def _rpc(
        self, url: str, method: str, kwargs: dict[str, Any], timeout_s: float | None = None
    ) -> list[Any]:
        """`/collective_rpc` on one server: each worker's result."""
        body: dict[str, Any] = {"method": method, "kwargs": kwargs}
        if timeout_s is not None:
            body["timeout"] = timeout_s
        r = await self._call(url, "/collective_rpc", body)
        if r is None:
            return []
        results = r.get("results")
        return results if isinstance(results, list) else []

    async def _call(self, url: str, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """A control call (its own httpx client: a push is rare, and its calls are long)."""
        headers = {k: v for k, v in self.engine._headers.items() if k == "Authorization"}
        try:
            async with httpx.AsyncClient(timeout=self.engine.options.update_timeout_s) as client:
                r = await client.post(f"{url}{path}", json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise EngineError(f"{url}{path}: {exc!r}") from exc
        if r.status_code != 200:
            text = r.text.strip()[:500]
            hint = ""
            if r.status_code == 404:
                hint = f" ({DEV_MODE_HINT})"
            elif "turnstile_" in text:
                hint = f" ({EXTENSION_HINT})"
            raise EngineError(f"{url}{path} answered {r.status_code}: {text}{hint}")
        return json_codec.loads(r.content) if r.content else None
