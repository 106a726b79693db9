"""Who may open the viewer: the admin, as for the admin API.

A browser cannot send an `Authorization` header on a link, so the key may also come
once as `?key=`: it is checked, kept in an HttpOnly cookie scoped to /ui, and the page
reloads without it (so it leaves the address bar and history). With no admin key
configured the gateway is loopback-only and the viewer is open, as the API is.

A key offered here that is not the admin key counts against its client as a failed key
check, and a locked-out client gets a 429 (auth_limits.py): the form is a way to guess
the admin key like any other.
"""

from __future__ import annotations

from fastapi import Request

from gateway.auth import bearer_token
from gateway.state import GatewayState

COOKIE = "turnstile_admin"


def offered_key(request: Request) -> str | None:
    return bearer_token(request) or request.cookies.get(COOKIE) or request.query_params.get("key")


def is_admin(state: GatewayState, request: Request) -> bool:
    """Is the offered key the admin key? Raises the 429 while this client is locked out."""
    return state.keys.check_admin(request, offered_key(request))


def stale_cookie(state: GatewayState, request: Request) -> bool:
    """Does the browser hold a cookie that is not the admin key (e.g. it was changed)?
    Then it is cleared, rather than offered, and counted, on every page it loads."""
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and not state.keys.is_admin_key(cookie)
