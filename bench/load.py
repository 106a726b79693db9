"""Load generator of bench/hot_path.py: concurrent agents running multi-turn chats,
non-streaming.

A conversation is `turns` chat completions in one session, each sending the whole
history, as an agent does; the same code drives the gateway (a session key per
conversation) and the pass-through (no session). aiohttp, since an httpx client tops out
near 300 requests/s on one core (DESIGN.md, "Targets").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.report import percentile

# What agents send: a ~1.7 kB system prompt (instructions and tool rules) and ~300-char
# user turns, asking for logprobs, as an RL rollout does.
SYSTEM = " ".join(
    f"Rule {i}: when a task needs a file, read it with the read tool before editing it, "
    "keep every change small, run the tests after each edit, and report what changed."
    for i in range(1, 12)
)
BODY = {"model": "default", "max_tokens": 64, "temperature": 1.0, "logprobs": True}


def question(conversation: int, turn: int) -> str:
    return (
        f"Task {conversation}.{turn}: the test suite reports a failure in module_{turn}.py "
        f"at line {40 + turn}: expected {turn + 2} items but found {turn + 1}. Look at the "
        "function that builds the list, find why one item goes missing when the input ends "
        "with an empty line, and propose the smallest fix, with the test that shows it."
    )


@dataclass(slots=True)
class Conversation:
    """Who the agent is for one conversation: a gateway session, or nobody (direct)."""

    session_id: str | None = None
    api_key: str | None = None


@dataclass(slots=True)
class Record:
    """One 200 answer: what the store check looks for."""

    response_id: str
    session_id: str | None
    conversation: int
    turn: int


@dataclass
class LevelResult:
    """A level's requests: answered, failed and how fast."""

    concurrency: int
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)  # 200s only
    statuses: Counter[int] = field(default_factory=Counter)  # 0 = transport error
    errors: list[str] = field(default_factory=list)  # the first few, for the report
    records: list[Record] = field(default_factory=list)

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    @property
    def failed(self) -> int:
        return sum(self.statuses.values()) - self.ok

    @property
    def rps(self) -> float:
        return self.ok / self.wall_s if self.wall_s else 0.0

    def pct(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def add(self, other: LevelResult) -> None:
        """Pool another round's requests into this one's."""
        self.wall_s += other.wall_s
        self.latencies_ms += other.latencies_ms
        self.statuses.update(other.statuses)
        self.errors += other.errors
        self.records += other.records


def connector(concurrency: int) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=max(concurrency, 1) + 4, enable_cleanup_closed=True)


async def create_session(
    http: aiohttp.ClientSession, url: str, admin_key: str | None, **body: Any
) -> tuple[str, str]:
    """A gateway session opened through the admin API (`POST /v1/sessions`): id, key."""
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    async with http.post(f"{url}/sessions", json=body, headers=headers) as r:
        assert r.status == 201, await r.text()
        data = await r.json()
    return data["id"], data["api_key"]


async def create_sessions(base_url: str, admin_key: str | None, n: int) -> list[Conversation]:
    """`n` gateway sessions, opened at most 8 at a time (the connector's connections)."""
    async with aiohttp.ClientSession(connector=connector(4)) as http:
        opened = (
            create_session(http, base_url, admin_key, metadata={"bench": True}) for _ in range(n)
        )
        return [Conversation(*ids) for ids in await asyncio.gather(*opened)]


@dataclass
class Chat:
    """Chat turns posted to `url` through `http`, each counted in `result`."""

    http: aiohttp.ClientSession
    url: str
    result: LevelResult

    async def turn(
        self, conv: Conversation, number: int, turn: int, messages: list, next_user: str
    ) -> bool:
        """Post the history; on a 200, extend it with the answer and `next_user`. False
        when the conversation cannot go on without its answer."""
        result = self.result
        headers = {"content-type": "application/json"}
        if conv.api_key:
            headers["authorization"] = f"Bearer {conv.api_key}"
        body = json.dumps({"messages": messages, **BODY}).encode()
        t0 = time.perf_counter()
        try:
            async with self.http.post(self.url, data=body, headers=headers) as resp:
                raw, status = await resp.read(), resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            result.statuses[0] += 1
            result.errors.append(f"turn {turn}: {type(exc).__name__}: {exc}")
            return False
        result.statuses[status] += 1
        if status != 200:
            result.errors.append(f"turn {turn}: HTTP {status}: {raw[:300]!r}")
            return False
        result.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        answer = json.loads(raw)
        result.records.append(Record(answer["id"], conv.session_id, number, turn))
        content = answer["choices"][0]["message"].get("content") or ""
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": next_user})
        return True


def opening(conversation: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question(conversation, 0)},
    ]


async def run_level(
    base_url: str,
    concurrency: int,
    conversations: list[Conversation],
    turns: int = 4,
    timeout_s: float = 60.0,
    first_conversation: int = 0,
) -> LevelResult:
    """Run every conversation (each `turns` requests) with `concurrency` agents at once."""
    result = LevelResult(concurrency)
    next_conv = iter(enumerate(conversations, start=first_conversation))

    async def agent(chat: Chat) -> None:
        for number, conv in next_conv:
            messages = opening(number)
            for turn in range(turns):
                if not await chat.turn(conv, number, turn, messages, question(number, turn + 1)):
                    break

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector(concurrency), timeout=timeout) as http:
        chat = Chat(http, f"{base_url}/chat/completions", result)
        t0 = time.perf_counter()
        await asyncio.gather(*(agent(chat) for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - t0
    return result


def tool_output(conversation: int, turn: int, size: int = 2000) -> str:
    """A ~2 kB block shaped like a tool's output (a test run's log), ~450 tokens."""
    lines, n = [], 0
    while n < size:
        k = len(lines)
        line = (
            f"test_{turn}_{k} in session {conversation}: the parser reads each line of the "
            f"input file, keeps the items it finds and skips the empty ones; {k % 7} checks passed."
        )
        lines.append(line)
        n += len(line) + 1
    return "Tool output:\n" + "\n".join(lines)


async def run_long(
    base_url: str,
    conversations: list[Conversation],
    turns: int,
    on_turn: Any,
    timeout_s: float = 300.0,
    first_conversation: int = 0,
) -> LevelResult:
    """Long sessions in lockstep: turn t of every conversation at once, then `on_turn(t,
    answered)` (e.g. to read the server's CPU), so costs can be told apart by turn."""
    result = LevelResult(len(conversations))
    histories = [opening(i) for i in range(len(conversations))]
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector(len(histories)), timeout=timeout) as http:
        chat = Chat(http, f"{base_url}/chat/completions", result)
        t0 = time.perf_counter()
        for turn in range(turns):
            ok = await asyncio.gather(
                *(
                    chat.turn(
                        conv, first_conversation + i, turn, histories[i], tool_output(i, turn)
                    )
                    for i, conv in enumerate(conversations)
                )
            )
            on_turn(turn, sum(ok))
            if not all(ok):
                break
        result.wall_s = time.perf_counter() - t0
    return result
