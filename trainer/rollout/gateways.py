"""Gateways the trainer did not start (`gateway.urls`): replicas of one store.

A run past one machine talks to several `turnstile serve` replicas sharing one
PostgreSQL (started by hand, by deploy/ray/gateway.sh, or by a cluster manager). Each
session sticks to one of them: the runner opens it there, its agent gets that
gateway's URL, and its rewards and export go there too. Because the store is shared,
any replica could read a session back; keeping them on one only spares a round trip.

New weights reach every replica's engine in one disk-free broadcast from trainer
rank 0 (trainer/backend/weight_push.py, over each gateway's `/admin/weights` routes),
so every token a replica records after the push carries the new policy version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from trainer.rollout.gateway_admin import GatewayAdmin


def v1_url(url: str) -> str:
    """A gateway's OpenAI base URL (…/v1), given with or without it."""
    from trainer.backend.weight_push import gateway_root

    return f"{gateway_root(url)}/v1"


class RemoteGateways:
    """The replicas of `gateway.urls`, as the trainer uses them: admin clients for the
    runner and one weight push to all of them."""

    def __init__(self, urls: Sequence[str], admin_key: str | None) -> None:
        if not admin_key:
            raise ValueError(
                "gateway.urls needs gateway.admin_key: the admin key those gateways were "
                "started with (sessions, rewards and weight pushes are admin calls)"
            )
        self.urls = [v1_url(u) for u in urls]
        if len(set(self.urls)) != len(self.urls):
            raise ValueError(f"gateway.urls lists a gateway twice: {self.urls}")
        self.admin_key = admin_key
        self._push: Any = None  # trainer.backend.weight_push.WeightPush, on the first push

    def admins(self, http: httpx.AsyncClient) -> list[tuple[GatewayAdmin, str]]:
        return [(GatewayAdmin(u, self.admin_key, http), u) for u in self.urls]

    def check(self, timeout_s: float = 30.0) -> list[int]:
        """Every gateway answers its admin key; returns the policy version each serves
        (a clear error before any model loads, not a failed first episode)."""
        versions = []
        with httpx.Client(timeout=timeout_s) as http:
            for url in self.urls:
                root = url.removesuffix("/v1")
                try:
                    r = http.get(
                        f"{root}/admin/weights",
                        headers={"Authorization": f"Bearer {self.admin_key}"},
                    )
                except httpx.HTTPError as exc:
                    raise ConnectionError(
                        f"gateway {url} (gateway.urls) is unreachable: {exc}"
                    ) from None
                if r.status_code != 200:
                    raise ConnectionError(
                        f"gateway {url} (gateway.urls) answered {r.status_code}: {r.text[:300]}"
                    )
                versions.append(int(r.json()["policy_version"]))
        return versions

    def push(self, version: int, state_dict: Mapping[str, Any]) -> None:
        """New weights to every gateway's engine; returns once all serve `version`."""
        from trainer.backend.weight_push import WeightPush

        if self._push is None:
            self._push = WeightPush(self.urls, self.admin_key)
        self._push.push(version, state_dict)

    def close(self) -> None:
        push, self._push = self._push, None
        if push is not None:
            push.shutdown()
