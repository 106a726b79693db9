"""Everything a request handler needs, built once per app (gateway/app.py), and
the FastAPI dependencies that hand it out (who is calling; which serving handler)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request

from gateway.auth import Caller, KeyRing
from gateway.chat.template import ChatRenderer
from gateway.config import GatewayConfig
from gateway.entrypoints.incremental_body import IncrementalBodies
from gateway.errors import APIError
from gateway.inference.base import InferenceEngine
from gateway.metrics import Metrics
from gateway.serving.endpoint import Stages
from gateway.store.recorder import Recorder
from gateway.store.repository import Repository

H = TypeVar("H")


@dataclass
class GatewayState:
    config: GatewayConfig
    engine: InferenceEngine
    renderer: ChatRenderer
    repo: Repository
    recorder: Recorder
    keys: KeyRing
    metrics: Metrics
    stages: Stages
    bodies: IncrementalBodies
    handlers: dict[type, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a session's state goes when it ends (auth.py), from every cache that keeps some
        self.keys.on_end += [
            self.stages.prompts.forget,
            self.bodies.forget,
            self.engine.forget_route,
        ]

    def serving(self, cls: type[H]) -> H:
        """The one handler of an endpoint (e.g. ChatCompletionServing), made on first use."""
        handler = self.handlers.get(cls)
        if handler is None:
            handler = self.handlers[cls] = cls(self.stages)  # type: ignore[call-arg]
            self.keys.on_end.append(handler.forget)
        return handler


async def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway


# Who is calling, and may they.
async def session_caller(request: Request) -> Caller:
    """A live session's key (for the OpenAI routes).

    `async` on purpose: a plain `def` dependency costs a thread-pool hop per request
    (docs/benchmarks.md); the key cache answers almost every call without I/O, and a
    miss is read off the event loop (auth.py).
    """
    return await request.app.state.gateway.keys.resolve(request, allow_admin=False)


async def any_caller(request: Request) -> Caller:
    """The admin, or a session key (ended sessions may still read and reward)."""
    return await request.app.state.gateway.keys.resolve(request, allow_admin=True, allow_ended=True)


async def admin_caller(request: Request) -> Caller:
    caller = await any_caller(request)
    if not caller.is_admin:
        raise APIError(403, "This endpoint needs the admin key.", code="admin_key_required")
    return caller


State = Annotated[GatewayState, Depends(get_state)]
Session = Annotated[Caller, Depends(session_caller)]
AnyCaller = Annotated[Caller, Depends(any_caller)]
Admin = Annotated[Caller, Depends(admin_caller)]
