"""The store's schema, in one revision squashed from the twelve it grew in.

It keeps the id of the last of them (0012), so a store they brought to head is at head
here. A store stopped at an earlier one is handed here unstamped (`database.migrate`) and
completed in place: the tables, columns and indexes it lacks are added, the index 0011
dropped goes, and if it predates delta storage its rows become deltas where they
continue their parent. The first signing key is made here: this runs once per store,
under its lock, so every replica finds the same key and no key is a constant of the
source. The old chain is kept for the tests in tests/fixtures/migrations_0001_0012/.

Revision ID: 0012
Revises:
"""

import secrets
import time

import sqlalchemy as sa
from alembic import op

from gateway.store.delta import Rebuilder, by_id, delta_columns

revision = "0012"
down_revision = None
branch_labels = None
depends_on = None

# the index 0011 dropped: the two below that start with session_id serve its lookups
DROPPED_INDEXES = {"ix_completions_session_id"}
SCHEMA = sa.MetaData()
# columns in the order the old chain added them, so both build the same tables
sa.Table(
    "sessions",
    SCHEMA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("key_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("sampling", sa.JSON, nullable=True),
    sa.Column("history", sa.String(16), nullable=True),
    sa.Column("quotas", sa.JSON(none_as_null=True), nullable=True),
    sa.Index("ix_sessions_key_hash", "key_hash", unique=True),
    sa.Index("ix_sessions_ended_at", "ended_at"),
)
COMPLETIONS = sa.Table(
    "completions",
    SCHEMA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id"), nullable=False),
    sa.Column("parent_id", sa.String(64), nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("endpoint", sa.String(32), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("request", sa.JSON, nullable=False),
    sa.Column("response", sa.JSON, nullable=False),
    sa.Column("prompt_ids", sa.LargeBinary, nullable=False),
    sa.Column("output_ids", sa.LargeBinary, nullable=False),
    sa.Column("output_logprobs", sa.LargeBinary, nullable=False),
    sa.Column("output_versions", sa.LargeBinary, nullable=False),
    sa.Column("finish_reason", sa.String(16), nullable=False),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("prefix_hash", sa.String(64), nullable=False),
    sa.Column("tokens_continue_parent", sa.Boolean, nullable=True),
    sa.Column("queue_s", sa.Float, nullable=False),
    sa.Column("gen_s", sa.Float, nullable=False),
    sa.Column("total_s", sa.Float, nullable=False),
    sa.Column("reward", sa.Float, nullable=True),
    sa.Column("reward_at", sa.Float, nullable=True),
    sa.Column("request_hash", sa.String(64), nullable=True),
    sa.Column("choice_index", sa.Integer, nullable=False, server_default="0"),
    sa.Column("is_delta", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("prompt_shared", sa.Integer, nullable=False, server_default="0"),
    sa.Column("diagnostics", sa.JSON, nullable=True),
    sa.Column("side_request", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index("ix_completions_session_prefix", "session_id", "prefix_hash"),
    sa.Index("ix_completions_session_request", "session_id", "request_hash"),
)
sa.Table(
    "inflight_requests",
    SCHEMA,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("session_id", sa.String(64), nullable=False),
    sa.Column("request_hash", sa.String(64), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_inflight_session_request", "session_id", "request_hash"),
)
SIGNING_KEYS = sa.Table(
    "signing_keys",
    SCHEMA,
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("secret", sa.String(128), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)


def upgrade() -> None:
    conn = op.get_bind()
    inspector = sa.inspect(conn)
    had = {t: {c["name"] for c in inspector.get_columns(t)} for t in inspector.get_table_names()}
    for table in SCHEMA.sorted_tables:
        if table.name not in had:
            table.create(conn)
            continue
        for column in table.columns:
            if column.name not in had[table.name]:
                op.add_column(table.name, _unbound(column))
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(conn)
        for name in indexes & DROPPED_INDEXES:
            op.drop_index(name, table_name=table.name)
    if "signing_keys" not in had:
        key = {"id": secrets.token_hex(6), "secret": secrets.token_hex(32)}
        conn.execute(SIGNING_KEYS.insert().values(created_at=time.time(), **key))
    if "completions" in had and "is_delta" not in had["completions"]:  # before delta storage
        _store_as_deltas(conn)


def _unbound(column: sa.Column) -> sa.Column:
    """A copy of `column` that `op.add_column` can attach to its own table."""
    default = getattr(column.server_default, "arg", None)
    return sa.Column(column.name, column.type, nullable=column.nullable, server_default=default)


def _store_as_deltas(conn: sa.Connection) -> None:
    """Rows written whole before delta storage, converted session by session in the order
    they were written: a row whose parent is in its session and which continues it
    (a list of its request, or the start of its tokens) becomes a delta on it."""
    c = COMPLETIONS.c
    for (session_id,) in conn.execute(sa.select(c.session_id).distinct()).all():
        query = sa.select(COMPLETIONS).where(c.session_id == session_id)
        rows = [r._mapping for r in conn.execute(query.order_by(c.created_at, c.id))]
        lookup = by_id(rows)  # all whole: read before any is rewritten
        rebuilder = Rebuilder(lookup)
        for row in rows:
            parent = lookup(row["parent_id"]) if row["parent_id"] else None
            if parent is None or parent["id"] == row["id"]:
                continue  # no parent in this session: stays whole
            mine = rebuilder.full(row)
            values = delta_columns(rebuilder.full(parent), mine.request, mine.prompt_ids)
            if values["is_delta"]:
                conn.execute(sa.update(COMPLETIONS).where(c.id == row["id"]).values(**values))


def downgrade() -> None:
    SCHEMA.drop_all(op.get_bind())
