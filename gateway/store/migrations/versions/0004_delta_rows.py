"""Delta storage: a turn stores only what is new on its parent (gateway/store/delta.py).

Existing rows are converted session by session, in the order they were written: a row
whose parent is in its session and which continues it (a list of its request, or the
start of its tokens) becomes a delta on it; any other row stays whole. Downgrade writes
every row whole again.

Revision ID: 0004
Revises: 0003
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from gateway.store.delta import Rebuilder, by_id, delta_columns

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_completions = sa.table(
    "completions",
    sa.column("id", sa.String),
    sa.column("session_id", sa.String),
    sa.column("parent_id", sa.String),
    sa.column("created_at", sa.Float),
    sa.column("request", sa.JSON),
    sa.column("prompt_ids", sa.LargeBinary),
    sa.column("output_ids", sa.LargeBinary),
    sa.column("is_delta", sa.Boolean),
    sa.column("prompt_shared", sa.Integer),
)


def _sessions(conn: sa.Connection) -> list[str]:
    c = _completions.c
    return [r[0] for r in conn.execute(sa.select(c.session_id).distinct())]


def _rows(conn: sa.Connection, session_id: str) -> list[Any]:
    c = _completions.c
    q = sa.select(_completions).where(c.session_id == session_id).order_by(c.created_at, c.id)
    return [r._mapping for r in conn.execute(q)]


def _write(conn: sa.Connection, row_id: str, values: dict[str, Any]) -> None:
    conn.execute(sa.update(_completions).where(_completions.c.id == row_id).values(**values))


def upgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.add_column(
            sa.Column("is_delta", sa.Boolean, nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("prompt_shared", sa.Integer, nullable=False, server_default="0"))
    conn = op.get_bind()
    for session_id in _sessions(conn):
        rows = _rows(conn, session_id)  # all whole: read before any is rewritten
        lookup = by_id(rows)
        rebuilder = Rebuilder(lookup)
        for row in rows:
            parent_row = lookup(row["parent_id"]) if row["parent_id"] else None
            if parent_row is None or parent_row["id"] == row["id"]:
                continue  # no parent in this session: stays whole
            mine = rebuilder.full(row)
            values = delta_columns(rebuilder.full(parent_row), mine.request, mine.prompt_ids)
            if values["is_delta"]:
                _write(conn, row["id"], values)


def downgrade() -> None:
    conn = op.get_bind()
    for session_id in _sessions(conn):
        rows = _rows(conn, session_id)
        rebuilder = Rebuilder(by_id(rows))
        for row in rows:
            if row["is_delta"]:
                full = rebuilder.full(row)
                whole = delta_columns(None, full.request, full.prompt_ids)
                _write(conn, row["id"], {k: whole[k] for k in ("request", "prompt_ids")})
    with op.batch_alter_table("completions") as batch:
        batch.drop_column("prompt_shared")
        batch.drop_column("is_delta")
