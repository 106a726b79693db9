"""One row per session with what a list of sessions is filtered and sorted by.

The viewer's sessions list pages through many sessions, so the counts (turns, tokens,
reward, drift, errors) are aggregated in SQL, on SQLite and PostgreSQL alike (JSON
fields through SQLAlchemy's portable JSON accessors), rather than by loading every
completion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Select, case, false, func, or_, select

from gateway.store.schema import CompletionRow, SessionRow

Status = Literal["active", "ended", "expired"]


@dataclass(slots=True)
class SessionFilter:
    """Which sessions to list; None means "either"."""

    status: Status | None = None
    has_reward: bool | None = None
    drifted: bool | None = None  # some turn's prompt stopped extending its parent's tokens
    errors: bool | None = None  # a tool call failed to parse, or an answer was aborted
    # metadata key -> value, e.g. {"run": "math", "step": "3"}; compared as text
    metadata: dict[str, str] = field(default_factory=dict)


def with_counts(aggregates: dict[str, Any], raw: tuple[str, ...] = ()) -> tuple[Select, Any]:
    """Every session's row with `aggregates` of its completions, by label (0 for a
    session without completions, but those named in `raw`: None); and their subquery."""
    s, c = SessionRow.__table__, CompletionRow.__table__
    sub = (
        select(c.c.session_id, *(a.label(k) for k, a in aggregates.items()))
        .group_by(c.c.session_id)
        .subquery()
    )
    q = select(
        s.c.id,
        s.c.created_at,
        s.c.expires_at,
        s.c.ended_at,
        s.c.metadata,
        *(sub.c[k] if k in raw else func.coalesce(sub.c[k], 0).label(k) for k in aggregates),
    ).outerjoin(sub, sub.c.session_id == s.c.id)
    return q, sub


def _meta_equals(key: str, value: str) -> Any:
    """JSON values are compared as text, so `step=3` finds both 3 and "3"."""
    s = SessionRow.__table__
    item = s.c.metadata[key]
    tests = [item.as_string() == value]
    try:
        tests.append(item.as_float() == float(value))
    except ValueError:
        pass
    if value in ("true", "false"):
        tests.append(item.as_boolean() == (value == "true"))
    return or_(*tests)


def summary_query(f: SessionFilter, limit: int, offset: int, now: float) -> Select:
    s, c = SessionRow.__table__, CompletionRow.__table__
    failures = func.coalesce(c.c.diagnostics["tool_parse_failures"].as_integer(), 0)
    q, counts = with_counts(
        {
            "turns": func.count(),
            "rewarded": func.count(c.c.reward),
            "reward": func.sum(c.c.reward),
            "prompt_tokens": func.sum(c.c.prompt_tokens),
            "completion_tokens": func.sum(c.c.completion_tokens),
            "drifted": func.sum(case((c.c.tokens_continue_parent == false(), 1), else_=0)),
            "errors": func.sum(case((or_(failures > 0, c.c.finish_reason == "abort"), 1), else_=0)),
        },
        raw=("reward",),
    )
    where = []
    if f.status == "ended":
        where.append(s.c.ended_at.is_not(None))
    elif f.status == "active":
        where += [s.c.ended_at.is_(None), s.c.expires_at > now]
    elif f.status == "expired":
        where += [s.c.ended_at.is_(None), s.c.expires_at <= now]
    flags = {"rewarded": f.has_reward, "drifted": f.drifted, "errors": f.errors}
    for name, flag in flags.items():
        if flag is not None:
            count = func.coalesce(counts.c[name], 0)
            where.append(count > 0 if flag else count == 0)
    where += [_meta_equals(k, v) for k, v in f.metadata.items()]
    return q.where(*where).order_by(s.c.created_at.desc(), s.c.id).limit(limit).offset(offset)


def summary_dict(r: Any, now: float) -> dict[str, Any]:
    status = "ended" if r.ended_at is not None else ("expired" if r.expires_at <= now else "active")
    return dict(
        id=r.id,
        created_at=r.created_at,
        status=status,
        metadata=dict(r.metadata or {}),
        turns=int(r.turns),
        rewarded=int(r.rewarded),
        reward=r.reward,
        prompt_tokens=int(r.prompt_tokens),
        completion_tokens=int(r.completion_tokens),
        drifted=int(r.drifted),
        errors=int(r.errors),
    )
