"""Marks of requests still generating, shared by the replicas of one PostgreSQL store.

A client retry is answered from the original's record (`Records.replay_of`). Within
one process the retry waits on the original's future; when a load balancer sends the
retry to another replica, that replica finds the original's mark here and waits until
it is gone (the original recorded, or failed) or has expired. A mark is a lease: the
replica generating renews it every `lease_s / 3`, so a replica killed mid-request holds
its retries up for at most `lease_s`. On SQLite, a single-process store, nothing is
written.
"""

from __future__ import annotations

import time
import uuid

from sqlalchemy import Engine, Executable, delete, exists, insert, select, text, update

from gateway.store.schema import InflightRow

_T = InflightRow.__table__


class InflightMarks:
    def __init__(self, db: Engine, lease_s: float = 6.0, sweep_every_s: float = 60.0) -> None:
        self.db = db
        self.lease_s = lease_s
        self.shared = db.dialect.name != "sqlite"
        # A replica that dies mid-request leaves its marks: they stop counting when they
        # expire, and whoever marks next after `sweep_every_s` deletes them.
        self.sweep_every_s = sweep_every_s
        self._next_sweep = 0.0

    def mark(self, session_id: str, request_hash: str) -> str | None:
        """Publish that this request is generating; its mark id (None: not shared)."""
        if not self.shared:
            return None
        mark_id = uuid.uuid4().hex
        expires_at = time.time() + self.lease_s
        statements = [
            insert(InflightRow).values(
                id=mark_id, session_id=session_id, request_hash=request_hash, expires_at=expires_at
            )
        ]
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.sweep_every_s
            statements.append(
                delete(InflightRow).where(_T.c.expires_at < expires_at - 2 * self.lease_s)
            )
        self._write(*statements)
        return mark_id

    def renew(self, mark_id: str) -> None:
        expires_at = time.time() + self.lease_s
        self._write(update(InflightRow).where(_T.c.id == mark_id).values(expires_at=expires_at))

    def clear(self, mark_id: str) -> None:
        self._write(delete(InflightRow).where(_T.c.id == mark_id))

    def _write(self, *statements: Executable) -> None:
        """In one transaction whose commit does not wait for the disk: a mark need not
        survive a server crash (a retry after one finds no original generating anyway)."""
        with self.db.begin() as conn:
            conn.execute(text("SET LOCAL synchronous_commit TO OFF"))
            for statement in statements:
                conn.execute(statement)

    def pending(self, session_id: str, request_hash: str) -> bool:
        """Is a request with this body still generating on some replica?"""
        if not self.shared:
            return False
        q = select(
            exists().where(
                _T.c.session_id == session_id,
                _T.c.request_hash == request_hash,
                _T.c.expires_at > time.time(),
            )
        )
        with self.db.connect() as conn:
            return bool(conn.execute(q).scalar())
