"""`POST /v1/responses`: a thin route; the work is in serving.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from gateway.entrypoints.openai.responses.protocol import ResponsesRequest
from gateway.entrypoints.openai.responses.serving import ResponsesServing
from gateway.state import Retry, Session, serving_of

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/responses", response_model=None)
async def create_response(
    body: ResponsesRequest,
    caller: Session,
    retry: Retry,
    serving: Annotated[ResponsesServing, Depends(serving_of(ResponsesServing))],
) -> Any:
    return await serving.handle_request(body, caller.session, retry)
