"""Everything a request handler needs, built once per app and shared."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from gateway.auth import Caller, KeyRing
from gateway.chat_template import ChatRenderer
from gateway.config import GatewayConfig
from gateway.engines.base import InferenceEngine
from gateway.metrics import Metrics
from gateway.serving_chat import ChatService
from gateway.serving_completions import CompletionService
from gateway.serving_core import ServingCore
from gateway.serving_responses import ResponsesService
from gateway.store.recorder import Recorder
from gateway.store.repository import Repository


@dataclass
class GatewayState:
    config: GatewayConfig
    engine: InferenceEngine
    renderer: ChatRenderer
    repo: Repository
    recorder: Recorder
    keys: KeyRing
    metrics: Metrics
    core: ServingCore
    chat: ChatService
    completions: CompletionService
    responses: ResponsesService


async def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway


# FastAPI dependencies: who is calling, and may they.
async def session_caller(request: Request) -> Caller:
    """A live session's key (for the OpenAI routes).

    `async` on purpose: a plain `def` dependency costs a thread-pool hop per request
    (docs/benchmarks.md); the key cache answers almost every call without I/O, and a
    miss is one indexed SQLite read.
    """
    return request.app.state.gateway.keys.resolve(request, allow_admin=False)


def any_caller(request: Request) -> Caller:
    """The admin, or a session key (ended sessions may still read and reward)."""
    return request.app.state.gateway.keys.resolve(request, allow_admin=True, allow_ended=True)


def admin_caller(request: Request) -> Caller:
    from gateway.errors import APIError

    caller = request.app.state.gateway.keys.resolve(request, allow_admin=True, allow_ended=True)
    if not caller.is_admin:
        raise APIError(
            403, "This endpoint needs the admin key.", code="admin_key_required", retryable=False
        )
    return caller
