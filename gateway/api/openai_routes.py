"""The OpenAI-compatible surface agents talk to."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from gateway.auth import Caller
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from gateway.protocol_responses import ResponsesRequest
from gateway.serving_core import request_hash
from gateway.state import GatewayState, get_state, session_caller

router = APIRouter(prefix="/v1", tags=["openai"])


@dataclass(frozen=True)
class RetryIdentity:
    """What tells a client's retry from a new request: the body bytes and its count."""

    body_hash: str
    retry_count: int


async def retry_identity(request: Request) -> RetryIdentity:
    try:  # OpenAI SDKs send how often they have retried this request
        count = int(request.headers.get("x-stainless-retry-count", "0"))
    except ValueError:
        count = 0
    return RetryIdentity(request_hash(await request.body()), count)


Session = Annotated[Caller, Depends(session_caller)]
State = Annotated[GatewayState, Depends(get_state)]
Retry = Annotated[RetryIdentity, Depends(retry_identity)]


@router.post("/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, caller: Session, state: State, retry: Retry
) -> Any:
    assert caller.session is not None
    return await state.chat.create(
        body, caller.session, body_hash=retry.body_hash, retry_count=retry.retry_count
    )


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, caller: Session, state: State, retry: Retry) -> Any:
    assert caller.session is not None
    return await state.completions.create(
        body, caller.session, body_hash=retry.body_hash, retry_count=retry.retry_count
    )


@router.post("/responses", response_model=None)
async def create_response(
    body: ResponsesRequest, caller: Session, state: State, retry: Retry
) -> Any:
    """The OpenAI Responses API (the Agents SDK's default)."""
    assert caller.session is not None
    return await state.responses.create(
        body, caller.session, body_hash=retry.body_hash, retry_count=retry.retry_count
    )


@router.get("/models")
async def list_models(caller: Session, state: State) -> dict[str, Any]:
    from openai.types import Model

    model = Model(
        id=state.config.served_model_name,
        created=int(time.time()),
        object="model",
        owned_by="turnstile",
    )
    return {"object": "list", "data": [model.model_dump()]}
