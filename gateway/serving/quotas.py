"""Admission: at most `max_pending_requests` answers generating in the gateway, and the
optional quotas a session is created with (most requests, generated tokens, requests at
once); past either, a 429 before any work. Requests and tokens are counted from the
session's committed records, so every replica sharing the database sees the same
totals; requests still generating are counted by the replica serving them (concurrency
is a per-replica limit).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, replace
from typing import Any

from gateway.errors import APIError
from gateway.metrics import Metrics
from gateway.serving.turn import Turn
from gateway.store.repository import Repository, SessionInfo


@dataclass(frozen=True, slots=True)
class Usage:
    """What a session has used: recorded requests and output tokens, plus in flight."""

    requests: int = 0
    generated_tokens: int = 0
    concurrent_requests: int = 0

    def view(self, quotas: dict[str, int] | None) -> dict[str, Any]:
        """The session's `quotas` field: each limit (None: none) and the usage so far."""
        limits = quotas or {}
        return {**{name: limits.get(name) for name in QUOTAS}, **asdict(self)}


class Admission:
    """The gate every request passes before it generates: the answers generating in the
    gateway, and each session's requests generating here."""

    def __init__(self, repo: Repository, metrics: Metrics, max_pending: int) -> None:
        self.repo, self.metrics, self.max_pending = repo, metrics, max_pending
        self.pending = 0  # answers generating now
        self.inflight: Counter[str] = Counter()  # session id -> its requests generating here

    def usage(self, session_id: str, recorded: tuple[int, int]) -> Usage:
        """`recorded`: (requests, generated tokens) committed for the session."""
        inflight = self.inflight[session_id]
        return Usage(recorded[0] + inflight, recorded[1], inflight)

    def admit(self, session: SessionInfo, turns: list[Turn], per_turn: int) -> Admitted:
        """429 when the gateway is full or a session quota is spent; a session with a
        token quota has each answer capped at the tokens it has left.

        Synchronous: the checks and the counts they guard change together, or two
        requests could both take the last free slot. So a session with quotas reads its
        usage on the event loop (one indexed query, as a key-cache miss does); an await
        between that read and the count would let a request that finishes meanwhile be
        counted neither as recorded nor in flight."""
        recorded = self.repo.session_usage(session.id) if session.quotas else None
        n = len(turns) * per_turn
        if self.pending + n > self.max_pending:
            self.metrics.inc("turnstile_rejected_requests_total")
            raise APIError(
                429,
                f"The gateway is already generating {self.pending} answers "
                f"(limit {self.max_pending}); retry shortly.",
                code="too_many_pending_requests",
                headers={"retry-after": "1"},
            )
        if recorded is None:
            self.pending += n
            return Admitted(self, n)
        limits, used = session.quotas or {}, self.usage(session.id, recorded)
        _check(limits, "max_concurrent_requests", used.concurrent_requests + 1, retry=True)
        _check(limits, "max_requests", used.requests + 1, retry=False)
        max_tokens = limits.get("max_generated_tokens")
        if max_tokens is not None:
            _check(limits, "max_generated_tokens", used.generated_tokens + 1, retry=False)
            budget = max((max_tokens - used.generated_tokens) // n, 1)
            for turn in turns:
                cap = min(turn.params.max_new_tokens, budget)
                turn.params = replace(turn.params, max_new_tokens=cap)
        self.pending += n
        self.inflight[session.id] += 1
        return Admitted(self, n, session.id)


class Admitted:
    """A request's share of the pending answers and of its session's requests in
    flight; released exactly once."""

    def __init__(self, gate: Admission, n: int, session_id: str | None = None) -> None:
        self._gate, self._n, self._session_id = gate, n, session_id

    def release(self) -> None:
        if self._n:
            self._gate.pending -= self._n
            self._n = 0
            if self._session_id is not None:
                self._gate.inflight[self._session_id] -= 1
                if self._gate.inflight[self._session_id] <= 0:
                    del self._gate.inflight[self._session_id]


_WHAT = {
    "max_requests": "requests",
    "max_generated_tokens": "generated tokens",
    "max_concurrent_requests": "requests generating at once",
}
QUOTAS = tuple(_WHAT)  # the limits a session may have (SessionQuotas)


def _check(limits: dict[str, int], name: str, wanted: int, *, retry: bool) -> None:
    limit = limits.get(name)
    if limit is None or wanted <= limit:
        return
    raise APIError(
        429,
        f"This session's quota of {limit} {_WHAT[name]} is spent ({name}).",
        code="quota_exceeded",
        param=f"quotas.{name}",
        retryable=retry,
        headers={"retry-after": "1"} if retry else None,
    )
