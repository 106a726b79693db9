"""Batched, durable writes of completion records.

A request's reply waits for the commit that holds its record, but many requests share
one commit: a writer thread drains whatever is queued and inserts it in one
transaction. That keeps "a 200 means it is on disk" without one fsync per request.
The thread keeps one connection open: a pool checkout, and the rollback the pool does on
every return, cost about half as much again as a one-row insert and commit. Its insert
is compiled once for the store's dialect and each row's values converted by the
columns' own bind processors as it is queued (`RowInsert`): SQLAlchemy's per-execute
work, done again for every one-row batch, was most of a record's CPU.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Dialect, Engine, insert
from sqlalchemy.exc import DBAPIError

from gateway.store.records import CompletionRecord
from gateway.store.schema import CompletionRow

log = logging.getLogger(__name__)

_Params = tuple[Any, ...] | dict[str, Any]
_Item = tuple[_Params, asyncio.AbstractEventLoop, asyncio.Future[None]]
# filled in later by the reward endpoints
_NOT_INSERTED = ("reward", "reward_at")


class RowInsert:
    """The `completions` insert as the driver takes it: its SQL in the dialect's own
    parameter style, and a row's values already through each column's bind processor
    (JSON to text, booleans, floats), as SQLAlchemy would convert them on every execute."""

    def __init__(self, dialect: Dialect) -> None:
        table = CompletionRow.__table__
        self.keys = [c.key for c in table.columns if c.key not in _NOT_INSERTED]
        compiled = insert(table).compile(dialect=dialect, column_keys=self.keys)
        self.sql = compiled.string
        self.positional = bool(compiled.positional)
        if self.positional and list(compiled.positiontup or ()) != self.keys:
            raise RuntimeError(f"unexpected insert parameters: {compiled.positiontup}")
        self._convert = [
            (key, table.c[key].type.dialect_impl(dialect).bind_processor(dialect))
            for key in self.keys
        ]

    def params(self, row: dict[str, Any]) -> _Params:
        """`row` (CompletionRecord.to_row) as the driver's parameters for `sql`."""
        values = [row[key] if f is None else f(row[key]) for key, f in self._convert]
        return tuple(values) if self.positional else dict(zip(self.keys, values, strict=True))


class RecordError(RuntimeError):
    """The record could not be committed; the client must not get a 200. Its
    `__cause__` is the store's own error (None when the recorder is not running)."""


class Recorder:
    def __init__(
        self,
        db: Engine,
        max_batch: int = 256,
        on_commit: Callable[[float], None] | None = None,
    ) -> None:
        """`on_commit(seconds)`: told how long each batch's insert + commit took."""
        self.db = db
        self.on_commit = on_commit
        self.max_batch = max_batch
        # the C queue: no Python-level lock and condition to take on every hand-off
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._insert = RowInsert(db.dialect)
        self._conn: Connection | None = None  # the writer thread's own
        self.committed = 0
        self.batches = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def record(self, record: CompletionRecord) -> asyncio.Future[None]:
        """Queue `record`; the future is done once it is committed (RecordError if it
        could not be). A caller cancelled while it waits loses nothing: the record is
        queued already, and a plain future (not a task) makes the wait cost no task."""
        row = self._insert.params(record.to_row())
        if self._thread is None:
            raise RecordError("recorder is not running")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((row, loop, fut))
        return fut

    def _run(self) -> None:
        try:
            self._drain()
        finally:
            self._close()

    def _drain(self) -> None:
        stopping = False
        while not stopping:
            item = _wait(self._queue)
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
            self._commit(batch)

    def _commit(self, batch: list[_Item]) -> None:
        error: BaseException | None = None
        started = time.perf_counter()
        try:
            self._write([row for row, _, _ in batch])
            self.committed += len(batch)
            self.batches += 1
            if self.on_commit is not None:
                self.on_commit(time.perf_counter() - started)
        except Exception as exc:  # report to every waiter; keep the thread alive
            log.exception("commit of %d completion records failed", len(batch))
            error = exc
        for _, loop, fut in batch:
            loop.call_soon_threadsafe(_settle, fut, error)

    def _write(self, rows: list[_Params]) -> None:
        """Insert and commit on the kept connection. One the store dropped (a restarted
        server) is replaced and the batch tried once more; any failure closes it."""
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = self.db.connect()
            try:
                with self._conn.begin():
                    self._conn.exec_driver_sql(self._insert.sql, rows)
                return
            except Exception as exc:
                self._close()
                if attempt == 2 or not (isinstance(exc, DBAPIError) and exc.connection_invalidated):
                    raise

    def _close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except Exception:  # a connection already broken: nothing to give back
                log.debug("closing the recorder's connection failed", exc_info=True)


def _wait(q: queue.SimpleQueue[_Item | None]) -> _Item | None:
    """Block for the next record: its own frame, so that a profile can tell the writer
    waiting (bench/hot_path.py counts it idle) from the writer working."""
    return q.get()


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        failed = RecordError(f"could not record completion: {error}")
        failed.__cause__ = error
        fut.set_exception(failed)
