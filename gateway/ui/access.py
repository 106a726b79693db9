"""Who may open the viewer: the admin, as for the admin API.

A browser cannot send an `Authorization` header on a link, so the key may also come
once as `?key=`: it is checked, kept in an HttpOnly cookie scoped to /ui, and the page
reloads without it (so it leaves the address bar and history). With no admin key
configured the gateway is loopback-only and the viewer is open, as the API is.
"""

from __future__ import annotations

from fastapi import Request

from gateway.auth import bearer_token
from gateway.state import GatewayState

COOKIE = "turnstile_admin"


def offered_key(request: Request) -> str | None:
    return bearer_token(request) or request.cookies.get(COOKIE) or request.query_params.get("key")


def is_admin(state: GatewayState, request: Request) -> bool:
    return state.keys.is_admin_key(offered_key(request))
