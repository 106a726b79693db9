"""`gateway.ray_replicas: N`: the trainer starts N gateway replicas as Ray actors.

Each actor runs a gateway (gateway/server.py's BackgroundGateway, the same server as
`turnstile serve`) in its own Ray worker on whatever node offers
`gateway.ray_resources`, bound to that node's address, with the run's admin key and
the one PostgreSQL store `gateway.database` names. From then on the trainer uses them
exactly as it uses `gateway.urls` (trainer/rollout/gateways.py): sessions round robin,
weights pushed to each without disk. The actors end with the run.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from gateway.config import GatewayConfig
from trainer.loading import WorkflowError


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
