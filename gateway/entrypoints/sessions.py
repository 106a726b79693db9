"""Sessions: create (admin), read back, end, and export as training samples."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from gateway.api_schema import errors, json_200
from gateway.auth import Caller, hash_key, new_session_key
from gateway.entrypoints.session_protocol import (
    CreatedSession,
    CreateSessionRequest,
    SessionDetail,
    SessionExport,
    SessionList,
    SessionView,
)
from gateway.errors import APIError
from gateway.samples import NoRewardError, export_session
from gateway.serving.quotas import Usage
from gateway.state import Admin, AnyCaller, GatewayState, State
from gateway.store.repository import SessionInfo, SessionTerms

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


def _session_view(info: SessionInfo, usage: Usage) -> dict[str, Any]:
    return {
        "id": info.id,
        "created_at": info.created_at,
        "expires_at": info.expires_at,
        "ended_at": info.ended_at,
        "status": "ended" if info.ended else ("expired" if info.expired() else "active"),
        "metadata": info.meta,
        "sampling": info.sampling,
        "prompt_mode": info.prompt_mode,
        "quotas": usage.view(info.quotas),
    }


def _owned_session(state: GatewayState, caller: Caller, session_id: str) -> SessionInfo:
    """404 both for unknown ids and for other sessions' ids: no existence leak."""
    info = state.repo.session(session_id) if caller.may_touch(session_id) else None
    if info is None:
        raise APIError(
            404,
            f"No session {session_id!r}.",
            code="session_not_found",
            param="session_id",
        )
    return info


@router.post(
    "",
    status_code=201,
    response_model=None,
    responses={
        201: {"model": CreatedSession, "description": "The session, with its API key."},
        **errors(400, 401, 403),
    },
)
async def create_session(
    state: State,
    _: Admin,
    body: CreateSessionRequest | None = None,
) -> dict[str, Any]:
    body = body or CreateSessionRequest()
    key = new_session_key()
    session_id = "sess-" + uuid.uuid4().hex
    ttl = min(body.ttl_seconds, state.config.session_ttl_s)
    terms = SessionTerms(
        sampling=body.sampling.model_dump(exclude_none=True) if body.sampling else None,
        prompt_mode=body.prompt_mode,
        quotas=body.quotas.model_dump(exclude_none=True) if body.quotas else None,
    )
    info = await run_in_threadpool(
        state.repo.create_session, session_id, hash_key(key), ttl, body.metadata, terms
    )
    state.keys.remember(key, info)
    state.metrics.inc("turnstile_sessions_created_total")
    return {**_session_view(info, Usage()), "api_key": key}


@router.get(
    "",
    response_model=None,
    responses={**json_200(SessionList, "Sessions, newest first."), **errors(400, 401, 403)},
)
async def list_sessions(
    state: State,
    _: Admin,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, lt=2**63)] = 0,  # SQL's bigint (fuzzer: 500)
) -> dict[str, Any]:
    rows = await run_in_threadpool(state.repo.list_sessions, limit, offset)
    return {"object": "list", "data": rows}


@router.get(
    "/{session_id}",
    response_model=None,
    responses={
        **json_200(SessionDetail, "The session with all its completions."),
        **errors(401, 404),
    },
)
async def get_session(session_id: str, state: State, caller: AnyCaller) -> dict[str, Any]:
    info = await run_in_threadpool(_owned_session, state, caller, session_id)
    completions = await run_in_threadpool(state.repo.completions, session_id)
    # its quotas' use: its records (requests counted by first choice), plus what generates now
    requests = sum(1 for c in completions if c["choice_index"] == 0)
    tokens = sum(c["completion_tokens"] for c in completions)
    usage = state.stages.admission.usage(session_id, (requests, tokens))
    mismatched = sum(1 for c in completions if c["tokens_continue_parent"] is False)
    return {
        **_session_view(info, usage),
        "completions": completions,
        "stats": {
            "num_completions": len(completions),
            "num_rewarded": sum(1 for c in completions if c["reward"] is not None),
            "token_prefix_mismatches": mismatched,
            "drift_causes": _drift_causes(completions),
            "tool_parse_failures": sum(
                c["diagnostics"].get("tool_parse_failures", 0) for c in completions
            ),
        },
    }


def _drift_causes(completions: list[dict[str, Any]]) -> dict[str, int]:
    """How many turns drifted from their parent's tokens, by cause ("unknown": not known)."""
    drifts = filter(None, (c["diagnostics"].get("drift") for c in completions))
    return dict(Counter(d.get("cause") or "unknown" for d in drifts))


@router.post(
    "/{session_id}/end",
    response_model=None,
    responses={**json_200(SessionView, "The ended session."), **errors(401, 404)},
)
async def end_session(session_id: str, state: State, caller: AnyCaller) -> dict[str, Any]:
    await run_in_threadpool(_owned_session, state, caller, session_id)
    info = await run_in_threadpool(state.repo.end_session, session_id)
    assert info is not None
    state.keys.forget(session_id)
    recorded = await run_in_threadpool(state.repo.session_usage, session_id)
    return _session_view(info, state.stages.admission.usage(session_id, recorded))


@router.get(
    "/{session_id}/export",
    response_model=None,
    responses={
        **json_200(SessionExport, "The session as training samples."),
        **errors(400, 401, 404, 409),
    },
)
async def export(
    session_id: str,
    state: State,
    caller: AnyCaller,
    style: str = "individual",
    turn_discount: Annotated[float, Query(ge=0.0, le=1.0)] = 1.0,
    include_side_requests: bool = False,
) -> dict[str, Any]:
    await run_in_threadpool(_owned_session, state, caller, session_id)
    completions = await run_in_threadpool(state.repo.completions, session_id)
    try:
        samples = export_session(
            session_id, completions, style, turn_discount, include_side_requests
        )
    except NoRewardError as exc:
        raise APIError(409, str(exc), code="no_reward") from exc
    except ValueError as exc:
        raise APIError(400, str(exc), code="invalid_export_style", param="style") from exc
    return {
        "session_id": session_id,
        "style": style,
        "turn_discount": turn_discount,
        "samples": [s.to_dict() for s in samples],
    }
