"""The generating routes, dispatched by a pure ASGI middleware before FastAPI's router:
through the router, every agent turn paid about a sixth of the gateway's CPU for route
matching and per-route wrappers (docs/benchmarks.md). An exact `POST` to a route marked
`hot` goes straight to its endpoint, its errors to the handlers FastAPI's path uses; the
routes stay declared on their routers (the OpenAPI document, a `GET`'s 405).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import EXCEPTION_HANDLERS

Handler = Callable[[Request], Awaitable[Response]]

# set on a route's endpoint by the code that defines it: "dispatch me before the router"
HOT = "turnstile_hot_route"


def hot(endpoint: Handler) -> Handler:
    """Mark a `(request) -> Response` endpoint as dispatched by `GeneratingRoutes`."""
    setattr(endpoint, HOT, True)
    return endpoint


class GeneratingRoutes:
    """Pure ASGI middleware: an exact `POST` to a `hot` route is answered here."""

    def __init__(self, app: ASGIApp, routers: Iterable[APIRouter]) -> None:
        self.app = app
        self.routes = {  # the `hot` POST routes, by exact path
            r.path: r
            for router in routers
            for r in router.routes
            if isinstance(r, APIRoute) and "POST" in r.methods and getattr(r.endpoint, HOT, False)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self.routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = route  # what the router sets: the request timer's label
        request = Request(scope, receive)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            # the gateway's handler for it, by class as Starlette looks it up
            handler = next(filter(None, map(EXCEPTION_HANDLERS.get, type(exc).__mro__)), None)
            if handler is None:
                raise  # the unexpected-error middleware outside answers it
            response = await handler(request, exc)
        await response(scope, receive, send)
