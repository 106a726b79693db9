"""Alembic environment: migrations run on the connection the gateway hands over."""

from alembic import context

from gateway.store.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through gateway.store.database.migrate()")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
