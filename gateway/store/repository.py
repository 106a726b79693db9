"""Reads and small writes of sessions, completions and rewards.

Completion inserts go through the batched Recorder; everything here is the slower,
rarer path (session admin, rewards, reading back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Executable, Row, func, select, update

from gateway.store.codec import unpack_floats, unpack_ints
from gateway.store.delta import Full, Rebuilder, by_id
from gateway.store.schema import CompletionRow, SessionRow, SigningKeyRow
from gateway.store.summaries import SessionFilter, summary_dict, summary_query, with_counts


@dataclass(slots=True, frozen=True, kw_only=True)
class SessionTerms:
    """What a session's creator may fix for every request of it (`POST /v1/sessions`)."""

    sampling: dict[str, Any] | None = None  # forced on every request of the session
    prompt_mode: str | None = None  # how its prompts are built (None: the gateway's default)
    quotas: dict[str, int] | None = None  # its limits (SessionQuotas fields), None: none


@dataclass(slots=True, frozen=True)
class SessionInfo(SessionTerms):
    id: str
    expires_at: float
    ended_at: float | None
    meta: dict[str, Any]
    created_at: float

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def expired(self) -> bool:
        return time.time() >= self.expires_at


class Repository:
    def __init__(self, db: Engine) -> None:
        self.db = db

    def _read(self, query: Executable) -> list[Row[Any]]:
        with self.db.connect() as conn:
            return list(conn.execute(query).all())

    def _write(self, query: Executable, rows: list[dict[str, Any]] | None = None) -> None:
        with self.db.begin() as conn:
            conn.execute(query, rows)

    # ---- sessions --------------------------------------------------------------------
    def create_session(
        self,
        session_id: str,
        key_hash: str,
        ttl_s: float,
        meta: dict[str, Any],
        terms: SessionTerms = SessionTerms(),
    ) -> SessionInfo:
        now = time.time()
        row = dict(
            id=session_id,
            key_hash=key_hash,
            created_at=now,
            expires_at=now + ttl_s,
            ended_at=None,
            metadata=meta,
            sampling=terms.sampling,
            history=terms.prompt_mode,  # (the column keeps the option's former name)
            quotas=terms.quotas,
        )
        self._write(SessionRow.__table__.insert(), [row])
        return _session_info(row)

    def session_by_key_hash(self, key_hash: str) -> SessionInfo | None:
        return self._session_where(SessionRow.__table__.c.key_hash == key_hash)

    def session(self, session_id: str) -> SessionInfo | None:
        return self._session_where(SessionRow.__table__.c.id == session_id)

    def _session_where(self, condition: Any) -> SessionInfo | None:
        rows = self._read(select(SessionRow.__table__).where(condition))
        return _session_info(rows[0]._mapping) if rows else None

    def sessions_ended_since(self, since: float) -> list[str]:
        """Ids of the sessions ended at or after `since` (epoch seconds), on any replica."""
        table = SessionRow.__table__
        return [r.id for r in self._read(select(table.c.id).where(table.c.ended_at >= since))]

    def end_session(self, session_id: str) -> SessionInfo | None:
        table = SessionRow.__table__
        self._write(
            update(table)
            .where(table.c.id == session_id, table.c.ended_at.is_(None))
            .values(ended_at=time.time())
        )
        return self.session(session_id)

    def list_sessions(self, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
        """Sessions, newest first, with their completion and reward counts (only these:
        `summary_query`'s further sums took 1.1-1.7x as long on a store of 20,000 turns)."""
        s, c = SessionRow.__table__, CompletionRow.__table__
        counts = {"num_completions": func.count(), "num_rewarded": func.count(c.c.reward)}
        q, _ = with_counts(counts)
        q = q.order_by(s.c.created_at.desc()).limit(limit).offset(offset)
        return [dict(r._mapping) for r in self._read(q)]

    def count_active_sessions(self) -> int:
        s = SessionRow.__table__
        q = select(func.count()).where(s.c.ended_at.is_(None), s.c.expires_at > time.time())
        return int(self._read(q)[0][0])

    def session_summaries(
        self, filters: SessionFilter, limit: int = 50, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Sessions, newest first, with their turn / token / reward / drift counts."""
        now = time.time()
        return [
            summary_dict(r, now) for r in self._read(summary_query(filters, limit, offset, now))
        ]

    def session_usage(self, session_id: str) -> tuple[int, int]:
        """(requests, generated tokens) recorded for the session, what its quotas count.

        A request is its first choice's row; a completions request with several prompts
        counts once per prompt."""
        c = CompletionRow.__table__
        q = select(
            func.count(c.c.id).filter(c.c.choice_index == 0),
            func.coalesce(func.sum(c.c.completion_tokens), 0),
        ).where(c.c.session_id == session_id)
        requests, tokens = self._read(q)[0]
        return int(requests), int(tokens)

    # ---- completions -----------------------------------------------------------------
    def completions(self, session_id: str) -> list[dict[str, Any]]:
        """Every completion of the session, whole (delta rows rebuilt, each parent once)."""
        c = CompletionRow.__table__
        q = select(c).where(c.c.session_id == session_id).order_by(c.c.created_at, c.c.id)
        maps = [r._mapping for r in self._read(q)]
        rebuilder = Rebuilder(by_id(maps))
        return [completion_dict(m, rebuilder.full(m)) for m in maps]

    def completion(self, session_id: str, completion_id: str) -> dict[str, Any] | None:
        """One completion of this session (None if unknown, or another session's)."""
        c = CompletionRow.__table__
        with self.db.connect() as conn:
            row = conn.execute(
                select(c).where(c.c.id == completion_id, c.c.session_id == session_id)
            ).first()
            if row is None:
                return None
            return completion_dict(
                row._mapping, self._rebuilder(conn, session_id).one(row._mapping)
            )

    def main_model(self, session_id: str, endpoint: str) -> str | None:
        """The model named by the session's first request on `endpoint` that was not a
        side request (None: there is none yet)."""
        c = CompletionRow.__table__
        rows = self._read(
            select(c.c.model)
            .where(c.c.session_id == session_id, c.c.endpoint == endpoint, ~c.c.side_request)
            .order_by(c.c.created_at)
            .limit(1)
        )
        return rows[0].model if rows else None

    def completion_owner(self, completion_ids: list[str]) -> dict[str, str]:
        c = CompletionRow.__table__
        rows = self._read(select(c.c.id, c.c.session_id).where(c.c.id.in_(completion_ids)))
        return {r.id: r.session_id for r in rows}

    def find_parent(
        self, session_id: str, prefix_hashes: list[str]
    ) -> tuple[str, Full, int] | None:
        """Latest completion of the session whose (messages + answer) hash is in the list,
        with its whole request and prompt ids, and the position of its hash in the list.

        The list is ordered longest prefix first; the longest match wins.
        """
        if not prefix_hashes:
            return None
        c = CompletionRow.__table__
        q = select(c.c.id, c.c.prefix_hash, c.c.created_at).where(
            c.c.session_id == session_id, c.c.prefix_hash.in_(prefix_hashes)
        )
        with self.db.connect() as conn:
            rows = conn.execute(q).all()
            if not rows:
                return None
            rank = {h: i for i, h in enumerate(prefix_hashes)}
            best = min(rows, key=lambda r: (rank[r.prefix_hash], -r.created_at))
            rebuilder = self._rebuilder(conn, session_id)
            return best.id, rebuilder.one(rebuilder.row(best.id)), rank[best.prefix_hash]

    def _rebuilder(self, conn: Any, session_id: str) -> Rebuilder:
        """A rebuilder over the session's stored rows (deltas: about one conversation)."""
        c = CompletionRow.__table__
        rows = conn.execute(
            select(
                c.c.id, c.c.parent_id, c.c.is_delta, c.c.prompt_shared, c.c.request,
                c.c.prompt_ids, c.c.output_ids,
            ).where(c.c.session_id == session_id)
        ).all()  # fmt: skip
        return Rebuilder(by_id(r._mapping for r in rows))

    def request_rows(self, session_id: str, request_hash: str, n: int) -> list[dict[str, Any]]:
        """The `n` choices of the latest request of the session with this body hash.

        Empty when there is none, or when not all of its choices were recorded.
        """
        c = CompletionRow.__table__
        with self.db.connect() as conn:
            first = conn.execute(
                select(c.c.id)
                .where(
                    c.c.session_id == session_id,
                    c.c.request_hash == request_hash,
                    c.c.choice_index == 0,
                )
                .order_by(c.c.created_at.desc())
                .limit(1)
            ).first()
            if first is None:
                return []
            ids = [first.id] + [f"{first.id}-{i}" for i in range(1, n)]
            rows = conn.execute(select(c).where(c.c.id.in_(ids))).all()
            if len(rows) != n:
                return []
            rebuilder = self._rebuilder(conn, session_id)
            return sorted(
                (completion_dict(r._mapping, rebuilder.one(r._mapping)) for r in rows),
                key=lambda d: d["choice_index"],
            )

    # ---- rewards ---------------------------------------------------------------------
    def set_rewards(self, rewards: dict[str, float]) -> int:
        """Upsert rewards by completion id (the same call twice leaves the same state)."""
        c = CompletionRow.__table__
        now = time.time()
        with self.db.begin() as conn:
            for cid, value in rewards.items():
                conn.execute(
                    update(c).where(c.c.id == cid).values(reward=float(value), reward_at=now)
                )
        return len(rewards)

    def mark_side_requests(self, session_id: str, completion_ids: list[str]) -> None:
        """Leave these completions out of training exports (a token-level episode's
        generations that it did not return for training, such as a greedy baseline)."""
        c = CompletionRow.__table__
        self._write(
            update(c)
            .where(c.c.session_id == session_id, c.c.id.in_(completion_ids))
            .values(side_request=True)
        )

    # ---- signing keys (gateway/signing.py) -------------------------------------------
    def signing_keys(self) -> list[tuple[str, str, float]]:
        """(id, secret, created_at) of each stored signing key, oldest first."""
        k = SigningKeyRow.__table__
        rows = self._read(select(k.c.id, k.c.secret, k.c.created_at))
        return sorted(((r.id, r.secret, r.created_at) for r in rows), key=lambda r: (r[2], r[0]))

    def add_signing_key(self, key_id: str, secret: str, created_at: float) -> None:
        row = {"id": key_id, "secret": secret, "created_at": created_at}
        self._write(SigningKeyRow.__table__.insert(), [row])


def _session_info(m: Any) -> SessionInfo:
    return SessionInfo(
        m["id"],
        m["expires_at"],
        m["ended_at"],
        dict(m["metadata"] or {}),
        m["created_at"],
        sampling=m["sampling"],
        prompt_mode=m["history"],
        quotas=m["quotas"],
    )


def completion_dict(m: Any, full: Full) -> dict[str, Any]:
    """A completion row as plain JSON-able data: token arrays decoded, and the request and
    prompt ids whole (`full`, rebuilt where the row is a delta)."""
    return dict(
        id=m["id"],
        session_id=m["session_id"],
        parent_id=m["parent_id"],
        created_at=m["created_at"],
        endpoint=m["endpoint"],
        model=m["model"],
        request=full.request,
        response=m["response"],
        prompt_ids=full.prompt_ids,
        output_ids=full.output_ids,
        output_logprobs=unpack_floats(m["output_logprobs"]),
        output_versions=unpack_ints(m["output_versions"]),
        finish_reason=m["finish_reason"],
        prompt_tokens=m["prompt_tokens"],
        completion_tokens=m["completion_tokens"],
        tokens_continue_parent=m["tokens_continue_parent"],
        timings=dict(queue_s=m["queue_s"], gen_s=m["gen_s"], total_s=m["total_s"]),
        reward=m["reward"],
        choice_index=m["choice_index"],
        side_request=bool(m["side_request"]),
        diagnostics=_diagnostics(m["diagnostics"]),
    )


# diagnostics keys records written before the option was named prompt_mode hold
_RENAMED_DIAGNOSTICS = {"history": "prompt_mode", "history_fallback": "prompt_mode_fallback"}


def _diagnostics(found: dict[str, Any] | None) -> dict[str, Any]:
    """A record's diagnostics under today's names, whenever it was written."""
    return {_RENAMED_DIAGNOSTICS.get(k, k): v for k, v in (found or {}).items()}
