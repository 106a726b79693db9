"""Stage 3 of a request, record: the durable record, client retries, requests in flight.

Every choice is committed before its client sees its end, and the commit goes on when
the client has already left. A client's retry of a request (the same body bytes, a
retry count above 0) is answered from the original's records instead of becoming a
second sample: `replay_of` waits for an original still generating, in this process
(`Tracked`'s future) or, on a shared store, on another replica (its mark in the store).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi.concurrency import run_in_threadpool

from gateway.errors import APIError, store_unavailable, store_unavailable_error
from gateway.metrics import Metrics
from gateway.serving.turn import Answer, Turn, completion_record
from gateway.store.inflight import InflightMarks
from gateway.store.recorder import Recorder, RecordError
from gateway.store.repository import Repository

log = logging.getLogger(__name__)
# how often a retry looks whether its original, generating on another replica, is done
RETRY_POLL_S = 0.1


@dataclass(frozen=True)
class RetryIdentity:
    """What tells a client's retry from a new request: the body bytes and its count."""

    body_hash: str | None = None
    retry_count: int = 0


class Records:
    def __init__(
        self, repo: Repository, recorder: Recorder, metrics: Metrics, timeout_s: float
    ) -> None:
        self.repo, self.recorder, self.metrics = repo, recorder, metrics
        self.timeout_s = timeout_s  # how long a retry waits for another replica's original
        # (session id, body hash) -> the original a retry waits for. Not an LRU: an entry
        # lives while its request generates, so `max_pending_requests` bounds them.
        self.inflight: dict[tuple[str, str], asyncio.Future[None]] = {}
        # the same, across the replicas of a shared store (leases: a dead replica's
        # marks lapse within seconds)
        self.marks = InflightMarks(repo.db)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def record(self, turn: Turn, answer: Answer, tool_parse_failures: int) -> None:
        """Commit one choice; return only once it is durable (RecordError -> 503).

        A client that disconnects does not cancel its record (see `Recorder.record`).
        """
        out = answer.out
        record = completion_record(
            turn, out, answer.response, answer.finish_reason, answer.answer_hash,
            tool_parse_failures,
        )  # fmt: skip
        try:
            await self.recorder.record(record)
        except RecordError as exc:
            self.metrics.inc("turnstile_record_failures_total")
            if exc.__cause__ is not None and store_unavailable(exc.__cause__):
                raise store_unavailable_error(exc.__cause__) from exc
            raise APIError(503, str(exc), code="record_failed") from exc
        self.metrics.inc("turnstile_completions_total")
        if out.index == 0:  # the choices of one request share its prompt
            self.metrics.inc("turnstile_prompt_tokens_total", len(turn.prompt_ids))
        self.metrics.inc("turnstile_completion_tokens_total", len(out.output_ids))
        self.metrics.completion_seconds.observe(time.perf_counter() - turn.started)

    async def replay_of(
        self, session_id: str, retry: RetryIdentity, n: int
    ) -> list[dict[str, Any]] | None:
        """For a client retry (retry count > 0): the original's recorded choices, if all
        of them were completed. Waits for the original while it is still generating."""
        body_hash = retry.body_hash
        if retry.retry_count <= 0 or body_hash is None:
            return None
        inflight = self.inflight.get((session_id, body_hash))
        if inflight is not None:
            await asyncio.shield(inflight)
        elif self.marks.shared:  # the original may be generating on another replica
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline and await run_in_threadpool(
                self.marks.pending, session_id, body_hash
            ):
                await asyncio.sleep(RETRY_POLL_S)
        rows = await run_in_threadpool(self.repo.request_rows, session_id, body_hash, n)
        if not rows or any(r["finish_reason"] == "abort" for r in rows):
            return None
        self.metrics.inc("turnstile_retries_replayed_total")
        return rows

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run work that must finish even if its client leaves (e.g. a stream's records)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class Tracked:
    """An in-flight request a retry can wait for: in this process (a future) and, on a
    shared store, on every replica (a mark in the store, `publish()`)."""

    def __init__(self, records: Records, session_id: str, body_hash: str | None) -> None:
        key = None if body_hash is None else (session_id, body_hash)
        self._records, self._key = records, key
        self.future: asyncio.Future[None] | None = None
        self._mark: str | None = None
        self._renewing: asyncio.Task[None] | None = None
        if key is not None:
            self.future = asyncio.get_running_loop().create_future()
            records.inflight[key] = self.future

    async def publish(self) -> None:
        """Let other replicas' retries of this request wait for it (shared store only)."""
        marks = self._records.marks
        if self._key is not None and marks.shared:
            self._mark = await run_in_threadpool(marks.mark, *self._key)
            self._renewing = self._records.spawn(self._renew(self._mark))

    async def _renew(self, mark: str) -> None:
        """Keep the mark's lease while generating (a dead replica's lapses)."""
        marks = self._records.marks
        while True:
            await asyncio.sleep(marks.lease_s / 3)
            try:
                await run_in_threadpool(marks.renew, mark)
            except Exception as exc:  # the store is down: the record will say so
                log.warning("could not renew in-flight mark: %s", exc)

    def done(self) -> None:
        if self.future is None or self.future.done():
            return
        self.future.set_result(None)
        inflight = self._records.inflight
        if inflight.get(self._key) is self.future:  # type: ignore[arg-type]
            del inflight[self._key]  # type: ignore[arg-type]
        if self._renewing is not None:
            self._renewing.cancel()
        if self._mark is not None:  # after the records: a waiting retry then finds them
            marks = self._records.marks
            self._records.spawn(run_in_threadpool(marks.clear, self._mark))
