"""Liveness and metrics, for load balancers and Prometheus."""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError

from gateway.metrics import CONTENT_TYPE
from gateway.state import State

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


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
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(state: State) -> Response:
    """Prometheus text format; the gauges are read at scrape time."""
    m = state.metrics
    m.policy_version.set(state.engine.version)
    m.records_committed.set(state.recorder.committed)
    m.record_batches.set(state.recorder.batches)
    m.engine_queue_depth.set(state.stages.admission.pending)
    try:
        m.sessions_active.set(await run_in_threadpool(state.repo.count_active_sessions))
    except SQLAlchemyError:  # the store is down: serve the rest, that is when they matter
        log.warning("/metrics: could not count active sessions; the store is unreachable")
    return Response(m.render(), media_type=CONTENT_TYPE)
