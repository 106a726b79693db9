"""The generating routes, dispatched by a pure ASGI middleware before FastAPI's router.

Every agent turn is a `POST /v1/chat/completions` (or `/completions`, `/responses`,
`/v1/messages`). Through FastAPI's router each one walked the route list, then FastAPI's
per-route wrapper (an exit stack, dependency solving, query parsing, response
serialisation) and Starlette's exception layer: about a sixth of the gateway's CPU per
request at one session (docs/benchmarks.md). Those handlers need none of it: they take
the `Request` and return a `Response`.

`GeneratingRoutes` is an ordinary pure ASGI middleware (Starlette's documented kind),
added with `app.add_middleware` as the innermost one, inside the request timer, the body
limit and the unexpected-error catcher, so those see these requests as any other. An
exact `POST` to a route whose endpoint is marked `hot` goes to that endpoint; its
errors go to the gateway's own exception handlers (`gateway.errors.EXCEPTION_HANDLERS`,
the table FastAPI's path is given too), so every status and error shape is the one
FastAPI's path gives. Anything else goes on to FastAPI's router. The routes stay declared
on their routers, so the OpenAPI document and a `GET`'s 405 are FastAPI's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

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


def hot_routes(routers: Iterable[APIRouter]) -> dict[str, APIRoute]:
    """The `hot` POST routes of `routers`, by exact path."""
    return {
        r.path: r
        for router in routers
        for r in router.routes
        if isinstance(r, APIRoute) and "POST" in r.methods and getattr(r.endpoint, HOT, False)
    }


class GeneratingRoutes:
    """Pure ASGI middleware: an exact `POST` to a `hot` route is answered here."""

    def __init__(self, app: ASGIApp, routers: Iterable[APIRouter]) -> None:
        self.app = app
        self.routes = hot_routes(routers)

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
            handler = handler_for(exc)
            if handler is None:
                raise  # the unexpected-error middleware outside answers it
            response = await handler(request, exc)
        await response(scope, receive, send)


def handler_for(exc: Exception) -> Callable[[Request, Any], Awaitable[Response]] | None:
    """The gateway's exception handler for `exc`, by class as Starlette looks it up."""
    for cls in type(exc).__mro__:
        if cls in EXCEPTION_HANDLERS:
            return EXCEPTION_HANDLERS[cls]
    return None
