"""`POST /v1/completions`: a thin route; the work is in serving.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from gateway.entrypoints.openai.completion.protocol import CompletionRequest
from gateway.entrypoints.openai.completion.serving import CompletionServing
from gateway.state import Retry, Session, serving_of

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/completions", response_model=None)
async def create_completion(
    body: CompletionRequest,
    caller: Session,
    retry: Retry,
    serving: Annotated[CompletionServing, Depends(serving_of(CompletionServing))],
) -> Any:
    return await serving.handle_request(body, caller.session, retry)
