"""Migrations on both stores: up from empty, down to nothing and up again, the result
equal to the tables the code declares and to what the twelve squashed migrations built,
stores at any of their revisions opening with their data, and replicas migrating one
database at once."""

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
from gateway_helpers import old_store

from gateway.store.codec import pack_floats, pack_ints
from gateway.store.database import (
    HEAD_REVISION,
    MIGRATIONS,
    SQUASHED,
    database_url,
    head_revision,
    migrate,
    open_database,
)
from gateway.store.repository import Repository
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


def test_a_store_at_head_opens_without_importing_alembic(new_database) -> None:
    """The gateway's start-up check reads the stamp itself (Alembic is ~11 MB of its
    memory); its revision must be the newest migration's, or a store would stay behind."""
    assert HEAD_REVISION == HEAD
    url = new_database()
    open_database(url).dispose()  # migrated here
    probe = (
        "import sys; from gateway.store.database import open_database; "
        f"open_database({str(url)!r}).dispose(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


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


def _inspected(engine: sa.Engine) -> dict[str, dict]:
    """Every table's columns (in order, with types, nullability, server defaults), primary
    and foreign keys, indexes and unique constraints, as the database reports them."""
    inspector = sa.inspect(engine)
    return {
        name: {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], c["default"])
                for c in inspector.get_columns(name)
            ],
            "pk": inspector.get_pk_constraint(name),
            "fks": inspector.get_foreign_keys(name),
            "indexes": sorted(inspector.get_indexes(name), key=lambda i: i["name"]),
            "unique": inspector.get_unique_constraints(name),
        }
        for name in sorted(inspector.get_table_names())
    }


def test_the_squashed_revision_builds_what_the_twelve_did(new_database) -> None:
    old_url, new_url = new_database(), new_database()
    old_store(old_url, "0012")
    old, new = sa.create_engine(database_url(old_url)), open_database(new_url)
    try:
        assert _revision(old) == _revision(new) == HEAD == "0012"
        assert _inspected(new) == _inspected(old)
    finally:
        old.dispose()
        new.dispose()


@pytest.mark.parametrize("revision", sorted(SQUASHED | {"0012"}))
def test_a_store_at_any_old_revision_opens_with_its_data(new_database, revision) -> None:
    """A session and two turns written at an old revision read back whole after opening;
    the schema is then the one a new store gets, with one signing key."""
    url = new_database()
    old_store(url, revision)
    engine = sa.create_engine(database_url(url))
    with engine.begin() as conn:
        tables = sa.MetaData()
        tables.reflect(conn)
        conn.execute(
            tables.tables["sessions"].insert(),
            {"id": "s1", "key_hash": "h1", "created_at": 1.0, "expires_at": 9e9,
             "ended_at": None, "metadata": {"task": "old"}},
        )  # fmt: skip
        turn = {
            "session_id": "s1", "created_at": 2.0, "endpoint": "chat", "model": "m",
            "response": {"role": "assistant", "content": "hi"}, "output_ids": pack_ints([7, 8]),
            "output_logprobs": pack_floats([-0.5, -0.25]), "output_versions": pack_ints([0, 0]),
            "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 2,
            "prefix_hash": "p", "tokens_continue_parent": None, "queue_s": 0.0, "gen_s": 0.0,
            "total_s": 0.0, "reward": 1.0, "reward_at": 3.0,
        }  # fmt: skip
        first = [{"role": "user", "content": "a"}]
        second = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "b"}]
        conn.execute(
            tables.tables["completions"].insert(),
            [
                {**turn, "id": "c1", "parent_id": None, "request": {"messages": first},
                 "prompt_ids": pack_ints([1, 2, 3])},
                {**turn, "id": "c2", "parent_id": "c1", "created_at": 4.0,
                 "request": {"messages": second}, "prompt_ids": pack_ints([1, 2, 3, 7, 8, 4])},
            ],
        )  # fmt: skip
        keys = (
            conn.execute(sa.text("SELECT id FROM signing_keys")).all() if revision == "0012" else []
        )
    engine.dispose()
    fresh = open_database(new_database())
    engine = open_database(url)
    try:
        assert _revision(engine) == HEAD
        assert _inspected(engine) == _inspected(fresh)
        repo = Repository(engine)
        assert repo.session("s1").meta == {"task": "old"}
        got = repo.completions("s1")
        assert [c["request"]["messages"] for c in got] == [first, second]
        assert [c["prompt_ids"] for c in got] == [[1, 2, 3], [1, 2, 3, 7, 8, 4]]
        assert [c["output_logprobs"] for c in got] == [[-0.5, -0.25]] * 2
        assert [(c["reward"], c["choice_index"], c["side_request"]) for c in got] == [
            (1.0, 0, False)
        ] * 2
        stored = repo.signing_keys()
        assert len(stored) == 1 and (not keys or stored[0][0] == keys[0][0])
        with engine.connect() as conn:
            deltas = conn.execute(sa.text("SELECT is_delta FROM completions ORDER BY id")).all()
        # the turn that continues its parent becomes a delta on opening a store from before
        # delta storage; written whole at a later revision, it is left whole
        assert [bool(d) for (d,) in deltas] == [False, revision < "0004"]
    finally:
        engine.dispose()
        fresh.dispose()


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
