"""An index on `sessions.ended_at`: every gateway replica asks every few seconds which
sessions ended lately, to stop their keys (gateway/auth.py), without scanning the table.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sessions_ended_at", "sessions", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_sessions_ended_at", table_name="sessions")
