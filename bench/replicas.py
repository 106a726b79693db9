"""Several `turnstile serve` replicas on one store, and agents that send each request of
a session to a random replica, as a load balancer without session affinity does: what
tests/test_replicas.py and bench/reliability.py drive.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import sqlalchemy as sa

from bench.load import create_session
from bench.procs import TURNSTILE, Child, Children, free_port

RETRY_HEADER = "x-stainless-retry-count"  # what OpenAI SDKs send on a retry
MAX_RETRIES = 30


class Replicas:
    """`n` gateway processes on one database URL; replica `i` keeps its port across
    restarts."""

    def __init__(
        self, n: int, database: str, work: Path, extra_args: list[str] | None = None
    ) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.children = Children(work)
        self.database = database
        self.admin_key = "adm-" + secrets.token_hex(16)
        self.extra_args = extra_args or []
        self.ports = [free_port() for _ in range(n)]
        self.procs: list[Child] = []
        self.restarts = 0

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}/v1" for p in self.ports]

    def health(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}/healthz"

    def argv(self, i: int) -> list[str]:
        return [TURNSTILE, "serve", "--engine", "fake", "--port", str(self.ports[i]),
                "--database", self.database, "--admin-key", self.admin_key,
                *self.extra_args]  # fmt: skip

    def start(self) -> Replicas:
        n = len(self.ports)
        try:
            # all at once: they migrate the store in turn
            self.procs = [self.children.start(f"replica{i}-0", self.argv(i)) for i in range(n)]
            for i, child in enumerate(self.procs):
                child.wait_http(self.health(i))
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL: no shutdown, no flush; what it answered 200 must already be stored."""
        self.procs[i].kill_hard()

    def restart(self, i: int) -> float:
        """Start replica `i` again on its port; seconds until it is healthy."""
        self.restarts += 1
        began = time.monotonic()
        name = f"replica{i}-{self.restarts}"
        self.procs[i] = self.children.start(name, self.argv(i), self.health(i))
        return time.monotonic() - began

    def stop(self) -> None:
        self.children.stop_all()

    def __enter__(self) -> Replicas:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


# ---- agents ----------------------------------------------------------------------------
@dataclass
class Sent:
    """One answered request, as its agent saw it."""

    session: str
    turn: int
    replica: int
    status: int
    latency_s: float
    completion_id: str | None = None
    parent_id: str | None = None  # the id of the turn before it in this session
    code: str | None = None


@dataclass
class Outcome:
    sent: list[Sent] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)  # completion id -> value
    retries_same_id: int = 0
    retries_other_id: list[tuple[str, str]] = field(default_factory=list)
    connection_errors: int = 0
    refused_503: int = 0  # 503s with retry-after, each followed by a retry
    elapsed_s: float = 0.0

    @property
    def ok(self) -> list[Sent]:
        return [s for s in self.sent if s.status == 200]


@dataclass
class Agents:
    """`sessions` agents, each `turns` turns, each request to a random live replica.

    A request that finds its replica gone (connection refused or cut) is retried on
    another one with the SDK's retry header, as a client behind a load balancer would.
    With `retry_every`, every that-many-th answered turn is also re-sent to another
    replica as a retry, which must return the same completion. Each answer gets a
    reward, posted twice at once through two other replicas, racing the next turns.
    """

    replicas: Replicas
    sessions: int
    turns: int
    retry_every: int = 0
    rewards: bool = True
    seed: int = 0
    down: set[int] = field(default_factory=set, init=False)  # killed replicas: not picked
    outcome: Outcome = field(default_factory=Outcome, init=False)
    session_keys: dict[str, str] = field(default_factory=dict, init=False)
    rewarding: list[asyncio.Future[None]] = field(default_factory=list, init=False)  # racing

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.http: aiohttp.ClientSession  # the run's, opened by run()

    def pick(self, avoid: int | None = None) -> int:
        live = [i for i in range(len(self.replicas.ports)) if i not in self.down]
        others = [i for i in live if i != avoid] or live
        return self.rng.choice(others)

    async def run(self) -> Outcome:
        began = time.monotonic()
        connector, timeout = aiohttp.TCPConnector(limit=0), aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            self.http = http
            admin, urls = self.replicas.admin_key, self.replicas.urls
            keys = await asyncio.gather(
                *(create_session(http, urls[self.pick()], admin) for _ in range(self.sessions))
            )
            self.session_keys = dict(keys)
            await asyncio.gather(*(self._agent(sid, key, n) for n, (sid, key) in enumerate(keys)))
            await asyncio.gather(*self.rewarding)
        self.outcome.elapsed_s = time.monotonic() - began
        return self.outcome

    async def _agent(self, session_id: str, key: str, n: int) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"Agent {n}."}]
        parent: str | None = None
        for turn in range(self.turns):
            messages.append({"role": "user", "content": f"Session {n}, turn {turn}: go on."})
            body = {"messages": messages, "max_tokens": 16, "logprobs": True}
            status, replica, reply, latency = await self._post("/chat/completions", body, key)
            sent = Sent(session_id, turn, replica, status, latency)
            self.outcome.sent.append(sent)
            if status != 200:
                sent.code = reply.get("error", {}).get("code")
                return  # the test looks at why
            sent.completion_id, sent.parent_id = reply["id"], parent
            if self.retry_every and turn % self.retry_every == self.retry_every - 1:
                await self._retry(key, body, sent)
            if self.rewards:
                value = float(n * 100 + turn)
                self.outcome.rewards[sent.completion_id or ""] = value
                self.rewarding.append(asyncio.ensure_future(self._reward(key, sent, value)))
            messages.append(reply["choices"][0]["message"])
            parent = sent.completion_id

    async def _post(
        self,
        path: str,
        body: dict[str, Any],
        key: str,
        avoid: int | None = None,
        first_attempt: int = 0,
    ) -> tuple[int, int, dict[str, Any], float]:
        """POST to a random live replica, as a client behind a load balancer does: a
        replica that is gone (connection refused or cut) or a 503 with `retry-after`
        (honoured, as the OpenAI SDK does) means trying again, with the SDK's retry
        header, on another replica. (status, replica, body, latency of the last try)."""
        attempt, replica = first_attempt, self.pick(avoid=avoid)
        while True:
            began = time.monotonic()
            headers = {"Authorization": f"Bearer {key}", RETRY_HEADER: str(attempt)}
            try:
                async with self.http.post(
                    f"{self.replicas.urls[replica]}{path}", json=body, headers=headers
                ) as r:
                    data = await r.json()
                    status, retry_after = r.status, r.headers.get("retry-after")
            except (TimeoutError, aiohttp.ClientConnectionError):
                self.outcome.connection_errors += 1
                attempt, replica = attempt + 1, self.pick(avoid=replica)
                await asyncio.sleep(0.05)
                continue
            if status == 503 and retry_after is not None and attempt < MAX_RETRIES:
                self.outcome.refused_503 += 1
                await asyncio.sleep(float(retry_after))
                attempt, replica = attempt + 1, self.pick(avoid=replica)
                continue
            return status, replica, data, time.monotonic() - began

    async def _retry(self, key: str, body: dict[str, Any], sent: Sent) -> None:
        """The same request again, as a client retry, through another replica."""
        status, _, data, _ = await self._post(
            "/chat/completions", body, key, avoid=sent.replica, first_attempt=1
        )
        assert status == 200, data
        if data["id"] == sent.completion_id:
            self.outcome.retries_same_id += 1
        else:
            self.outcome.retries_other_id.append((sent.completion_id or "", data["id"]))

    async def _reward(self, key: str, sent: Sent, value: float) -> None:
        """The same upsert through two replicas at once: idempotent, whoever wins."""
        body = {"completion_id": sent.completion_id, "reward": value}

        async def post() -> None:
            status, _, data, _ = await self._post("/rewards", body, key, avoid=sent.replica)
            assert status == 200, data

        await asyncio.gather(post(), post())


# ---- what the store holds --------------------------------------------------------------
def stored_completions(database: str) -> dict[str, dict[str, Any]]:
    """Every stored completion: id -> {session_id, parent_id, reward, endpoint,
    tokens_continue_parent}."""
    columns = "session_id, parent_id, reward, endpoint, tokens_continue_parent"
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT id, {columns} FROM completions")).all()
    finally:
        engine.dispose()
    return {r.id: r._asdict() for r in rows}


def lost_or_wrong(outcome: Outcome, stored: dict[str, dict[str, Any]]) -> list[str]:
    """Every 200 that is not in the store under its session with its parent (or whose
    reward is not the one posted): empty when nothing was lost."""
    problems = []
    for s in outcome.ok:
        row = stored.get(s.completion_id or "")
        if row is None:
            problems.append(f"{s.completion_id}: answered 200, not stored")
        elif row["session_id"] != s.session:
            problems.append(f"{s.completion_id}: stored under {row['session_id']}")
        elif row["parent_id"] != s.parent_id:
            problems.append(f"{s.completion_id}: parent {row['parent_id']} != {s.parent_id}")
        elif (
            s.completion_id in outcome.rewards
            and row["reward"] != outcome.rewards[s.completion_id or ""]
        ):
            problems.append(f"{s.completion_id}: reward {row['reward']}")
    return problems
