"""The trainer's view of the gateways its agents use, over their REST API.

Going through HTTP (not the gateway's objects) keeps the trainer working unchanged
against its own gateway, `gateway.urls` (`turnstile serve` replicas sharing one
PostgreSQL) and `gateway.ray_replicas` (replicas it starts as Ray actors). Each session
sticks to one replica; every replica gets each step's weights without disk
(trainer/backend/weight_push.py; docs/scaling.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import httpx

from gateway.config import GatewayConfig
from trainer.loading import WorkflowError


class GatewayRequestError(RuntimeError):
    pass


class GatewayAdmin:
    """One gateway's admin calls (sessions, rewards, export) on the trainer's HTTP client."""

    def __init__(self, base_url: str, admin_key: str | None, client: httpx.AsyncClient) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        url = self.base_url + path
        try:
            resp = await self.client.request(method, url, headers=self.headers, **kwargs)
        except httpx.TransportError:
            if method != "GET":  # a POST may have landed: sending it again could apply it twice
                raise
            # e.g. a keep-alive connection the gateway closed just as it was reused
            resp = await self.client.request(method, url, headers=self.headers, **kwargs)
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                message = f"{err.get('code')}: {err.get('message')}"
            except Exception:
                message = resp.text[:300]
            raise GatewayRequestError(f"{method} {path} -> {resp.status_code} {message}")
        return resp.json()

    async def create_session(
        self, metadata: dict[str, Any] | None = None, sampling: dict[str, Any] | None = None
    ) -> tuple[str, str]:
        request: dict[str, Any] = {"metadata": metadata or {}}
        if sampling:
            request["sampling"] = sampling
        body = await self._call("POST", "/sessions", json=request)
        return body["id"], body["api_key"]

    async def session(self, session_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/sessions/{session_id}")

    async def set_rewards(self, rewards: dict[str, float]) -> None:
        if rewards:
            await self._call("POST", "/rewards", json={"rewards": rewards})

    async def end_session(self, session_id: str) -> None:
        await self._call("POST", f"/sessions/{session_id}/end")

    async def export(
        self, session_id: str, style: str, turn_discount: float
    ) -> list[dict[str, Any]]:
        body = await self._call(
            "GET",
            f"/sessions/{session_id}/export",
            params={"style": style, "turn_discount": turn_discount},
        )
        return body["samples"]


def v1_url(url: str) -> str:
    """A gateway's OpenAI base URL (…/v1), given with or without it."""
    from trainer.backend.weight_push import gateway_root

    return f"{gateway_root(url)}/v1"


@dataclass
class RemoteGateways:
    """The replicas of `gateway.urls` (given with or without /v1; kept as /v1 URLs) and
    their admin key: the trainer opens sessions on them and pushes each step's weights
    to all of them (trainer.py)."""

    urls: list[str]
    admin_key: str | None

    def __post_init__(self) -> None:
        if not self.admin_key:
            raise ValueError(
                "gateway.urls needs gateway.admin_key: the admin key those gateways were "
                "started with (sessions, rewards and weight pushes are admin calls)"
            )
        self.urls = [v1_url(u) for u in self.urls]
        if len(set(self.urls)) != len(self.urls):
            raise ValueError(f"gateway.urls lists a gateway twice: {self.urls}")

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


class GatewayActor:
    """One replica inside a Ray worker; `url()` once it serves."""

    def __init__(self, settings: dict[str, Any]) -> None:
        import ray

        from gateway.server import BackgroundGateway

        config = GatewayConfig(**settings)
        config.host = ray.util.get_node_ip_address()
        config.port = 0
        self.gateway = BackgroundGateway(config).start()

    def url(self) -> str:
        return self.gateway.url

    def stop(self) -> None:
        self.gateway.stop()


class GatewayActors:
    """The replicas the trainer started; `urls` to use, `stop()` at the end."""

    def __init__(
        self,
        n: int,
        config: GatewayConfig,
        admin_key: str,
        ray_address: str | None,
        resources: dict[str, float] | None = None,
    ) -> None:
        database = config.database or ""
        if n > 1 and not database.startswith("postgresql"):
            raise WorkflowError(
                "gateway.ray_replicas > 1 needs gateway.database: a PostgreSQL URL every "
                "node reaches (the replicas share one store)"
            )
        from trainer.rollout.ray_agents import connect

        ray = connect(ray_address)
        names = {f.name for f in fields(GatewayConfig)}
        settings = {k: v for k, v in asdict(config).items() if k in names}
        settings["admin_key"] = admin_key
        actor = ray.remote(GatewayActor).options(
            num_cpus=1, resources=dict(resources or {}), max_restarts=0
        )
        self._ray = ray
        self.handles = [actor.remote(settings) for _ in range(n)]
        try:
            self.urls: list[str] = ray.get([h.url.remote() for h in self.handles])
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for handle in self.handles:
            try:
                self._ray.get(handle.stop.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead actor is stopped already
                pass
            self._ray.kill(handle)
        self.handles = []
