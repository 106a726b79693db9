"""A completion may be a client's side request (Claude Code's title generation, a small
model's chore): `side_request`, left out of training exports by default.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.add_column(
            sa.Column("side_request", sa.Boolean, nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.drop_column("side_request")
