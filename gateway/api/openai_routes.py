"""The OpenAI-compatible surface agents talk to."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from gateway.auth import Caller
from gateway.protocol import ChatCompletionRequest
from gateway.state import GatewayState, get_state, session_caller

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    caller: Annotated[Caller, Depends(session_caller)],
    state: Annotated[GatewayState, Depends(get_state)],
) -> dict[str, Any]:
    assert caller.session is not None
    return await state.chat.create(body, caller.session)


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
