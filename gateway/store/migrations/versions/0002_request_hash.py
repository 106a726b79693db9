"""Retries and `n` choices: request hash and choice index on completions.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.add_column(sa.Column("request_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("choice_index", sa.Integer, nullable=False, server_default="0"))
    op.create_index("ix_completions_session_request", "completions", ["session_id", "request_hash"])


def downgrade() -> None:
    op.drop_index("ix_completions_session_request", table_name="completions")
    with op.batch_alter_table("completions") as batch:
        batch.drop_column("choice_index")
        batch.drop_column("request_hash")
