"""Opening the database and bringing its schema up to date."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event

from gateway import json_codec

MIGRATIONS = Path(__file__).with_name("migrations")


def database_url(path_or_url: str | Path) -> str:
    """Accept a SQLAlchemy URL or a plain file path (SQLite)."""
    text = str(path_or_url)
    if "://" in text:
        return text
    Path(text).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(text).expanduser()}"


def open_database(path_or_url: str | Path) -> Engine:
    url = database_url(path_or_url)
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_serializer=json_codec.dumps_text,
            hide_parameters=True,  # see below
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL is durable against process crashes (the file survives a
            # killed gateway); FULL would also survive power loss at a commit's cost.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    else:
        engine = create_engine(
            url,
            pool_pre_ping=True,
            pool_size=10,
            max_overflow=20,
            json_serializer=json_codec.dumps_text,
            # A failed statement's error would otherwise carry its parameters (prompts,
            # key hashes) into the log; the gateway logs no prompt text.
            hide_parameters=True,
        )
    migrate(engine)
    return engine


def migrate(engine: Engine) -> None:
    """Run Alembic migrations up to head on this database."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
