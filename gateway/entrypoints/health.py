"""Liveness and metrics, for load balancers and Prometheus."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from gateway.state import State

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(state: State) -> JSONResponse:
    ok = await state.engine.health()
    body = {
        "status": "ok" if ok else "engine_unavailable",
        "engine": state.engine.name,
        "policy_version": state.engine.version,
    }
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(state: State) -> PlainTextResponse:
    gauges = {
        "turnstile_policy_version": float(state.engine.version),
        "turnstile_records_committed": float(state.recorder.committed),
        "turnstile_record_batches": float(state.recorder.batches),
    }
    return PlainTextResponse(state.metrics.render(gauges), media_type="text/plain; version=0.0.4")
