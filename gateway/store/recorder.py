"""Batched, durable writes of completion records.

A request's reply waits for the commit that holds its record, but many requests share
one commit: a writer thread drains whatever is queued and inserts it in one
transaction. That keeps "a 200 means it is on disk" without one fsync per request.
The thread keeps one connection open: a pool checkout, and the rollback the pool does on
every return, cost about half as much again as a one-row insert and commit.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, insert
from sqlalchemy.exc import DBAPIError

from gateway.store.records import CompletionRecord
from gateway.store.schema import CompletionRow

log = logging.getLogger(__name__)

_Item = tuple[dict[str, Any], asyncio.AbstractEventLoop, asyncio.Future[None]]


class RecordError(RuntimeError):
    """The record could not be committed; the client must not get a 200.

    `cause` is the store's own error (None when the recorder is not running).
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class Recorder:
    def __init__(
        self,
        engine: Engine,
        max_batch: int = 256,
        on_commit: Callable[[float], None] | None = None,
    ) -> None:
        """`on_commit(seconds)`: told how long each batch's insert + commit took."""
        self.engine = engine
        self.on_commit = on_commit
        self.max_batch = max_batch
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._insert = insert(CompletionRow)
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

    async def record(self, record: CompletionRecord) -> None:
        """Return once `record` is committed; raise RecordError if it could not be."""
        row = record.to_row()
        if self._thread is None:
            raise RecordError("recorder is not running")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((row, loop, fut))
        await fut

    def _run(self) -> None:
        try:
            self._drain()
        finally:
            self._close()

    def _drain(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
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

    def _write(self, rows: list[dict[str, Any]]) -> None:
        """Insert and commit on the kept connection. One the store dropped (a restarted
        server) is replaced and the batch tried once more; any failure closes it."""
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = self.engine.connect()
            try:
                with self._conn.begin():
                    self._conn.execute(self._insert, rows)
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


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(RecordError(f"could not record completion: {error}", error))
