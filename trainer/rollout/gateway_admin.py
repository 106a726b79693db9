"""The trainer's admin-side view of a gateway, over its REST API.

Going through HTTP (not the gateway's objects) keeps the trainer working unchanged
against a remote gateway or several replicas sharing PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import httpx


class GatewayRequestError(RuntimeError):
    pass


class GatewayAdmin:
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
