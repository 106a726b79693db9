"""Migrations on both stores: up from empty, down to nothing and up again, the result
equal to the tables the code declares, and replicas migrating one database at once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from gateway.store.database import (
    MIGRATIONS,
    database_url,
    head_revision,
    migrate,
    open_database,
)
from gateway.store.schema import Base

pytestmark = pytest.mark.both_stores

HEAD = head_revision()


def _alembic(conn: sa.Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def _revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _schema_drift(engine: sa.Engine) -> list:
    """What autogenerate would still write: nothing, if migrations match schema.py."""
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_migrations_build_the_declared_schema(new_database) -> None:
    engine = open_database(new_database())
    try:
        assert _revision(engine) == HEAD
        assert _schema_drift(engine) == []
    finally:
        engine.dispose()


def test_down_to_nothing_and_up_again(new_database) -> None:
    engine = open_database(new_database())
    try:
        with engine.begin() as conn:
            command.downgrade(_alembic(conn), "base")
        assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
        migrate(engine)
        assert _revision(engine) == HEAD
        assert _schema_drift(engine) == []
    finally:
        engine.dispose()


def test_replicas_opening_one_empty_database_at_once_all_start(new_database) -> None:
    """Three processes opening one empty store together (as replicas starting at once
    do): one migrates, the others wait for it and find the schema at head."""
    url = database_url(new_database())
    code = (
        "import sys; from gateway.store.database import open_database; open_database(sys.argv[1])"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url], env=env, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    engine = sa.create_engine(url)
    try:
        assert _revision(engine) == HEAD and _schema_drift(engine) == []
    finally:
        engine.dispose()


def test_a_new_sqlite_file_locked_by_another_process_is_waited_for(tmp_path) -> None:
    """SQLite runs no busy handler for the switch to WAL. A replica opening a new file while
    another holds its lock (switching or migrating it) waits rather than failing."""
    path = tmp_path / "store.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE placeholder (x)")  # a file in rollback-journal mode
    holder.execute("BEGIN IMMEDIATE")  # the write lock a switch or migration holds
    code = (
        "import sys; from gateway.store.database import open_database; open_database(sys.argv[1])"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], env=env, stderr=subprocess.PIPE
    )
    time.sleep(3)  # the replica is up and contending for the lock by now
    holder.execute("COMMIT")
    holder.close()
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 0, err
    engine = open_database(path)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert _revision(engine) == HEAD
    finally:
        engine.dispose()


def test_a_store_in_memory_opens() -> None:
    """`sqlite://` has no WAL to switch to; it opens (and migrates) as it did before."""
    engine = open_database("sqlite://")
    try:
        assert _revision(engine) == HEAD
    finally:
        engine.dispose()
