"""The generating routes, called straight from the ASGI server.

Every agent turn is a `POST /v1/chat/completions` (or `/completions`, `/responses`,
`/v1/messages`). Through FastAPI, each one passed FastAPI's and Starlette's own layers
(a check for OpenTelemetry providers, the server-error and body-limit middlewares, the
exception middleware, each wrapping `send`), walked the router's route list, then
FastAPI's per-route wrapper (an exit stack, dependency solving, query parsing, response
serialisation): about a sixth of the gateway's CPU per request at one session
(docs/benchmarks.md). Those handlers need none of it: they take the `Request` and return
a `Response`.

`GatewayAPI` is the FastAPI app, and sends an exact `POST` to one of them through the
app's own middlewares only (the ones added with `add_middleware`: the request timer,
the body limit, the unexpected-error catcher), built into a second stack around the
handler. Errors go to the app's own exception handlers, so every status and error shape
is the one FastAPI's path gives. Anything else goes on through FastAPI as usual. (FastAPI's
built-in OpenTelemetry spans, off unless the process configures a provider, are not made
for these routes; the gateway's Prometheus metrics are.)
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
    """Mark a `(request) -> Response` endpoint as served past FastAPI's stack."""
    setattr(endpoint, DIRECT, True)
    return endpoint


class GatewayAPI(FastAPI):
    """FastAPI, with the `direct` POST routes served past its own layers."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.direct_routes: dict[str, APIRoute] = {}
        self._direct_stack: ASGIApp | None = None

    def serve_directly(self, routers: Iterable[APIRouter]) -> None:
        """Take the `direct` POST routes of `routers` (`self.routes` holds included
        routers unexpanded); call after the middlewares are added."""
        self.direct_routes = {
            r.path: r
            for router in routers
            for r in router.routes
            if isinstance(r, APIRoute)
            and "POST" in r.methods
            and getattr(r.endpoint, DIRECT, False)
        }
        stack: ASGIApp = self._serve_route
        for cls, args, kwargs in reversed(self.user_middleware):
            stack = cls(stack, *args, **kwargs)
        self._direct_stack = stack

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and self._direct_stack:
            route = self.direct_routes.get(scope["path"])
            if route is not None:
                scope["app"] = self  # what Starlette sets: handlers read `request.app.state`
                scope["route"] = route  # what the router sets: the request timer's label
                await self._direct_stack(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _serve_route(self, scope: Scope, receive: Callable, send: Callable) -> None:
        request = Request(scope, receive)
        try:
            response = await scope["route"].endpoint(request)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise  # the unexpected-error middleware outside answers it
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Callable[..., Awaitable[Response]] | None:
        """The app's exception handler for `exc`, by class as Starlette looks it up."""
        handlers = self.exception_handlers
        for cls in type(exc).__mro__:
            if cls in handlers:
                return handlers[cls]
        return None
