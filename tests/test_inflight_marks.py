"""Retry marks shared by the replicas of a PostgreSQL store do not pile up: a replica
that died mid-request leaves its marks behind, and a later mark sweeps away those that
expired more than a lease ago (the table stays the size of what is generating)."""

from __future__ import annotations

import time

import sqlalchemy as sa

from gateway.store.database import migrate, open_database
from gateway.store.inflight import InflightMarks
from gateway.store.schema import InflightRow


def test_marks_a_dead_replica_left_are_swept(postgres) -> None:
    engine = open_database(postgres.create_database())
    migrate(engine)
    try:
        marks = InflightMarks(engine, lease_s=6.0)
        now = time.time()
        with engine.begin() as conn:  # a dead replica's: long expired, and one still live
            conn.execute(
                sa.insert(InflightRow),
                [
                    {"id": "dead", "session_id": "s", "request_hash": "h1", "expires_at": now - 60},
                    {"id": "live", "session_id": "s", "request_hash": "h2", "expires_at": now + 5},
                ],
            )
        assert marks.pending("s", "h2") and not marks.pending("s", "h1")
        mine = marks.mark("s", "h3")
        with engine.connect() as conn:
            left = set(conn.execute(sa.select(InflightRow.__table__.c.id)).scalars())
        assert left == {"live", mine}
        marks.clear(mine)
    finally:
        engine.dispose()
