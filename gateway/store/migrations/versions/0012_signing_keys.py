"""Signing keys kept in the store (gateway/signing.py), and the deployment's first one,
made here: the migration runs once per store, under its lock, so every replica of it
finds the same key, and no key is a constant of the source.

Revision ID: 0012
Revises: 0011
"""

import secrets
import time

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "signing_keys",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    key = {"id": secrets.token_hex(6), "secret": secrets.token_hex(32), "created_at": time.time()}
    op.bulk_insert(table, [key])


def downgrade() -> None:
    op.drop_table("signing_keys")
