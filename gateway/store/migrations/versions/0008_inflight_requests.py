"""Requests still generating, visible to every replica of a shared store, so that a
client's retry reaching another replica waits for the original instead of generating
a second answer (gateway/store/inflight.py).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inflight_requests",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index(
        "ix_inflight_session_request", "inflight_requests", ["session_id", "request_hash"]
    )


def downgrade() -> None:
    op.drop_table("inflight_requests")
