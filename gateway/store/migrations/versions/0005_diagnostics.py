"""What went wrong with a completion that is not an error: tool calls that did not
parse, and where its prompt stopped continuing its parent's tokens (drift).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.add_column(sa.Column("diagnostics", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("completions") as batch:
        batch.drop_column("diagnostics")
