"""The generating routes, called straight from the ASGI stack.

Every agent turn is a `POST /v1/chat/completions` (or `/completions`, `/responses`,
`/v1/messages`). Through FastAPI, each one walked the router's route list, then
FastAPI's per-route wrapper (an exit stack, dependency solving, query parsing, response
serialisation): about an eighth of the gateway's CPU per request at one session
(docs/benchmarks.md). Those handlers need none of it: they take the `Request` and return
a `Response`. `HotRoutes` sits inside the gateway's own middlewares (timer, body limit,
unexpected errors) and sends an exact `POST` to one of them directly; errors go to the
app's own exception handlers, so every status and error shape is the one FastAPI's path
gives. Anything else (another method, another path) goes on through FastAPI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]
Handler = Callable[[Request], Awaitable[Response]]

# set on a route's endpoint by the code that defines it: "call me directly"
DIRECT = "turnstile_direct"


def direct(endpoint: Handler) -> Handler:
    """Mark a `(request) -> Response` endpoint as served by `HotRoutes`."""
    setattr(endpoint, DIRECT, True)
    return endpoint


class HotRoutes:
    """Pure ASGI middleware: `POST` to a route marked `direct` skips FastAPI's routing."""

    def __init__(self, app: ASGIApp, api: FastAPI, routers: Iterable[APIRouter]) -> None:
        """`routers`: the app's routers (`api.routes` holds them unexpanded)."""
        self.app = app
        self.api = api
        self.routes = {
            r.path: r
            for router in routers
            for r in router.routes
            if isinstance(r, APIRoute)
            and "POST" in r.methods
            and getattr(r.endpoint, DIRECT, False)
        }

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.routes.get(scope["path"])
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = route  # what FastAPI's router sets (the request timer's label)
        request = Request(scope, receive)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise  # the unexpected-error middleware outside answers it
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Callable[..., Awaitable[Response]] | None:
        """The app's exception handler for `exc`, by class as Starlette looks it up."""
        handlers = self.api.exception_handlers
        for cls in type(exc).__mro__:
            if cls in handlers:
                return handlers[cls]
        return None
