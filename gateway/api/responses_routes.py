"""`POST /v1/responses`: the OpenAI Responses API (the Agents SDK's default)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from gateway.api.openai_routes import retry_count
from gateway.auth import Caller
from gateway.protocol_responses import ResponsesRequest
from gateway.serving_core import request_hash
from gateway.serving_responses import ResponsesService
from gateway.state import GatewayState, get_state, session_caller

router = APIRouter(prefix="/v1", tags=["openai"])


def responses_service(
    request: Request, state: Annotated[GatewayState, Depends(get_state)]
) -> ResponsesService:
    """One service per app, built on the app's ServingCore on first use."""
    service = getattr(request.app.state, "responses", None)
    if service is None:
        service = ResponsesService(state.core, state.renderer, state.metrics)
        request.app.state.responses = service
    return service


@router.post("/responses", response_model=None)
async def create_response(
    body: ResponsesRequest,
    request: Request,
    caller: Annotated[Caller, Depends(session_caller)],
    service: Annotated[ResponsesService, Depends(responses_service)],
) -> Any:
    assert caller.session is not None
    return await service.create(
        body,
        caller.session,
        body_hash=request_hash(await request.body()),
        retry_count=retry_count(request),
    )
