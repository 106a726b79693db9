"""Sessions and completions.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("metadata", sa.JSON, nullable=False),
    )
    op.create_index("ix_sessions_key_hash", "sessions", ["key_hash"], unique=True)
    op.create_table(
        "completions",
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
    )
    op.create_index("ix_completions_session_id", "completions", ["session_id"])
    op.create_index("ix_completions_session_prefix", "completions", ["session_id", "prefix_hash"])


def downgrade() -> None:
    op.drop_table("completions")
    op.drop_table("sessions")
