"""Drop `ix_completions_session_id`: the indexes on (session_id, prefix_hash) and
(session_id, request_hash) already serve every lookup by session, and each completion's
insert wrote one B-tree more than it needed.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_completions_session_id", table_name="completions")


def downgrade() -> None:
    op.create_index("ix_completions_session_id", "completions", ["session_id"])
