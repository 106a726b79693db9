"""`POST /v1/chat/completions`: a thin route; the work is in serving.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from gateway.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from gateway.entrypoints.openai.chat_completion.serving import ChatCompletionServing
from gateway.state import Retry, Session, serving_of

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest,
    caller: Session,
    retry: Retry,
    serving: Annotated[ChatCompletionServing, Depends(serving_of(ChatCompletionServing))],
) -> Any:
    return await serving.handle_request(body, caller.session, retry)
