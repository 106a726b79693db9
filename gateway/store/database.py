"""Opening the database and bringing its schema up to date."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, event, inspect, text

from gateway import json_codec

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
# the newest migration's revision (tests/test_store_migrations.py holds it to Alembic's):
# a store already there opens without importing Alembic (~11 MB of the gateway's memory)
HEAD_REVISION = "0012"
# any fixed number: the PostgreSQL advisory lock that replicas migrate under
MIGRATION_LOCK = 7_248_163_001
# the revisions squashed into 0012_schema.py, which completes a store stopped at one of them
SQUASHED = {f"{n:04d}" for n in range(1, 12)}
# Alembic's command API keeps its context in module globals: one migration per process
_ALEMBIC = threading.Lock()
# how long a connection waits for SQLite's locks: the busy timeout, and the WAL switch
SQLITE_LOCK_WAIT_S = 30.0


def database_url(path_or_url: str | Path) -> str:
    """Accept a SQLAlchemy URL or a plain file path (SQLite)."""
    text = str(path_or_url)
    if "://" in text:
        return text
    Path(text).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(text).expanduser()}"


def open_database(path_or_url: str | Path) -> Engine:
    url = database_url(path_or_url)
    # hide_parameters: a failed statement's error would otherwise carry its parameters
    # (prompts, key hashes) into the log; the gateway logs no prompt text.
    common = {"json_serializer": json_codec.dumps_text, "hide_parameters": True}
    if url.startswith("sqlite"):
        connect_args = {"check_same_thread": False, "timeout": SQLITE_LOCK_WAIT_S}
        db = create_engine(url, connect_args=connect_args, **common)

        @event.listens_for(db, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            _switch_to_wal(dbapi_conn)
            cur = dbapi_conn.cursor()
            # WAL + NORMAL is durable against process crashes (the file survives a
            # killed gateway); FULL would also survive power loss at a commit's cost.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    else:
        db = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, **common)
    migrate(db)
    return db


def _switch_to_wal(dbapi_conn: sqlite3.Connection, wait_s: float = SQLITE_LOCK_WAIT_S) -> None:
    """Put the file in WAL mode, waiting for the lock the switch needs.

    SQLite runs no busy handler for `PRAGMA journal_mode=WAL`: a process that opens a new
    file while another is switching or migrating it gets "database is locked" at once. WAL
    stays set in the file, so once it is there this is one read and takes no lock.
    """
    deadline = time.monotonic() + wait_s
    delay = 0.005
    while dbapi_conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            # WAL now, or a mode the database cannot leave (one in memory keeps "memory")
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def head_revision() -> str:
    """The newest migration's revision id: what `migrate` brings a store to."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(_alembic_config()).get_current_head())


def _alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def migrate(db: Engine, revision: str = "head") -> None:
    """Run Alembic migrations up to `revision` on this database.

    Processes opening one store together take turns: the first migrates under a lock
    (PostgreSQL: a transaction-scoped advisory lock; SQLite: the write lock, taken up
    front), the others then find the schema at head. A store at a squashed revision is
    unstamped first, so that the one revision there is runs on it.
    """
    if revision == "head" and _revision_of(db) == HEAD_REVISION:
        return
    from alembic import command
    from alembic.migration import MigrationContext

    cfg = _alembic_config()
    with _ALEMBIC, db.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        elif conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # waits up to the busy timeout
        cfg.attributes["connection"] = conn
        if MigrationContext.configure(conn).get_current_revision() in SQUASHED:
            command.stamp(cfg, "base", purge=True)
        command.upgrade(cfg, revision)


def _revision_of(db: Engine) -> str | None:
    """The store's revision as Alembic stamped it (None: not stamped yet)."""
    with db.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
