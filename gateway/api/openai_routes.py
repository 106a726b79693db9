"""The OpenAI-compatible surface agents talk to."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from gateway.auth import Caller
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from gateway.serving_completions import CompletionService
from gateway.serving_core import request_hash
from gateway.state import GatewayState, get_state, session_caller

router = APIRouter(prefix="/v1", tags=["openai"])


def retry_count(request: Request) -> int:
    """How often the client says it has retried this request (OpenAI SDKs send it)."""
    try:
        return int(request.headers.get("x-stainless-retry-count", "0"))
    except ValueError:
        return 0


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    caller: Annotated[Caller, Depends(session_caller)],
    state: Annotated[GatewayState, Depends(get_state)],
) -> Any:
    assert caller.session is not None
    return await state.chat.create(
        body,
        caller.session,
        body_hash=request_hash(await request.body()),
        retry_count=retry_count(request),
    )


@router.post("/completions", response_model=None)
async def completions(
    body: CompletionRequest,
    request: Request,
    caller: Annotated[Caller, Depends(session_caller)],
    state: Annotated[GatewayState, Depends(get_state)],
) -> Any:
    assert caller.session is not None
    return await CompletionService(state.core).create(
        body,
        caller.session,
        body_hash=request_hash(await request.body()),
        retry_count=retry_count(request),
    )


@router.get("/models")
async def list_models(
    caller: Annotated[Caller, Depends(session_caller)],
    state: Annotated[GatewayState, Depends(get_state)],
) -> dict[str, Any]:
    from openai.types import Model

    model = Model(
        id=state.config.served_model_name,
        created=int(time.time()),
        object="model",
        owned_by="turnstile",
    )
    return {"object": "list", "data": [model.model_dump()]}
