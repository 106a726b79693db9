"""Liveness and metrics, for load balancers and Prometheus."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from gateway.state import State

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: Literal["ok", "engine_unavailable"]
    engine: str
    policy_version: int


@router.get(
    "/healthz",
    response_model=None,
    responses={
        200: {"model": Health, "description": "The engine answers."},
        503: {"model": Health, "description": "The engine does not answer."},
    },
)
async def healthz(state: State) -> JSONResponse:
    ok = await state.engine.health()
    body = {
        "status": "ok" if ok else "engine_unavailable",
        "engine": state.engine.name,
        "policy_version": state.engine.version,
    }
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(state: State) -> PlainTextResponse:
    gauges = {
        "turnstile_policy_version": float(state.engine.version),
        "turnstile_records_committed": float(state.recorder.committed),
        "turnstile_record_batches": float(state.recorder.batches),
    }
    return PlainTextResponse(state.metrics.render(gauges), media_type="text/plain; version=0.0.4")
