"""The gateway's hot path behind an external engine process, against a naive pass-through
proxy in the same rounds (the machine's speed drifts: their ratio is the figure). The
method and the figures: docs/benchmarks.md, whose sections this run rewrites.

    python -m bench.hot_path              # ~1 min on 2 cores; --long: ~2 min
    python -m bench.hot_path --profile    # needs `pip install py-spy`
    python -m bench.hot_path --also /tmp/before --no-docs   # this gateway vs another's

`--also DIR` measures the gateway of another checkout too (`git worktree add DIR COMMIT`)
in the same rounds, to compare a change where the machine's speed cannot move the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from bench import engine_server
from bench.load import Conversation, LevelResult, Record, create_sessions, run_level, run_long
from bench.procs import TURNSTILE, Child, Children, can_pin, free_port, run_children
from bench.replicas import stored_completions
from bench.report import ROOT, arguments, cpu_name, publish, section, table

PASS, GATEWAY = "pass-through", "gateway"
# Which library a py-spy sample is charged to: the innermost frame whose file matches.
# where an idle thread's stack ends (py-spy samples every thread, busy or not)
IDLE = (
    "select (selectors",
    "Condition.wait",
    "Queue.get",
    "Event.wait",
    "poll (selectors",
    "_wait (gateway/store/recorder.py",  # the writer thread, waiting for a record
    "_worker (concurrent/futures/thread.py",  # a pool thread, waiting for work
)
OWNERS = {
    "routing, middleware (starlette, fastapi)": ("starlette/", "fastapi/"),
    "HTTP server (uvicorn, h11, httptools)": ("uvicorn/", "h11/", "httptools/"),
    "tokenizer, chat template (tokenizers, transformers, jinja2)": (
        "tokenizers/",
        "transformers/",
        "jinja2/",
    ),
    "JSON, validation (json, orjson, pydantic)": ("json/", "orjson", "pydantic"),
    "upstream client (httpx, httpcore, aiohttp)": ("httpx/", "httpcore/", "aiohttp/"),
    "store (sqlalchemy, sqlite3)": ("sqlalchemy/", "sqlite3/"),
    "event loop (asyncio, anyio, uvloop)": ("asyncio/", "anyio/", "uvloop/", "selectors"),
    "gateway's own code": ("gateway/",),
}


@dataclass
class Run:
    """A path at a level: its requests, its server's CPU, and (long sessions) that CPU
    per request turn by turn and its RSS after."""

    path: str
    result: LevelResult
    cpu_s: float
    turn_cpu_ms: list[float] = field(default_factory=list)
    rss: int = 0

    @property
    def cpu_ms(self) -> float:
        return 1000.0 * self.cpu_s / self.result.ok if self.result.ok else float("nan")

    def buckets(self) -> dict[str, float]:
        """Mean CPU ms per request over the first, middle and last 8 turns."""
        n, cpu = len(self.turn_cpu_ms), self.turn_cpu_ms
        spans = [(0, 8), (n // 2 - 8, n // 2), (n - 8, n)] if n >= 24 else [(0, n)]
        return {f"{a + 1}-{b}": sum(cpu[a:b]) / (b - a) for a, b in spans}


def pooled(runs: list[Run]) -> list[Run]:
    """One run per (path, sessions): the rounds' requests and CPU together, and CPU per
    request averaged turn by turn."""
    groups: dict[tuple[str, int], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.path, r.result.concurrency), []).append(r)
    out = []
    for group in groups.values():
        last = group[-1]
        result = LevelResult(last.result.concurrency)
        for r in group:
            result.add(r.result)
        turns = min(len(r.turn_cpu_ms) for r in group)
        cpu = [sum(r.turn_cpu_ms[t] for r in group) / len(group) for t in range(turns)]
        out.append(Run(last.path, result, sum(r.cpu_s for r in group), cpu, last.rss))
    return out


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def machine() -> str:
    """The machine, the commit and the libraries on the path: what the figures depend on."""
    libraries = ("fastapi", "uvicorn", "httpx", "tokenizers", "transformers", "uvloop")
    pkgs = ", ".join(f"{name} {metadata.version(name)}" for name in libraries)
    dirty = " + uncommitted changes" if git("status", "--porcelain", "-uno") != "unknown" else ""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Measured {when} at commit `{git('rev-parse', '--short', 'HEAD')}`{dirty} on "
        f"{os.cpu_count()} cores ({cpu_name()}), Python {platform.python_version()}; {pkgs}."
    )


def storage(db: Path, sessions: set[str | None]) -> tuple[float, float]:
    """Mean bytes stored per session, and mean bytes of its final conversation (the last
    turn's prompt + output ids, 4 bytes each, and its request's JSON, rebuilt whole)."""
    import sqlalchemy as sa

    from gateway.store.repository import Repository

    repo = Repository(sa.create_engine(f"sqlite:///{db}"))
    with repo.db.connect() as conn:
        per_session = dict(conn.execute(sa.text(
            "SELECT session_id, sum(length(request) + length(response) + length(prompt_ids)"
            " + length(output_ids) + length(output_logprobs) + length(output_versions))"
            " FROM completions GROUP BY session_id"
        )).all())  # fmt: skip
    ours = [sid for sid in sessions if sid is not None and sid in per_session]
    final = []
    for sid in ours:
        last = repo.completions(sid)[-1]
        ids = len(last["prompt_ids"]) + len(last["output_ids"])
        final.append(4 * ids + len(json.dumps(last["request"])))
    repo.db.dispose()
    return statistics.fmean(per_session[sid] for sid in ours), statistics.fmean(final)


def check_store(db_path: Path, records: list[Record]) -> tuple[bool, str]:
    """Whether every 200 is stored once, under its session; and the verdict in words,
    with how many later turns are linked to their parent and continue its tokens."""
    rows = stored_completions(f"sqlite:///{db_path}").values()
    stored = {r["id"]: r for r in rows if r["endpoint"] == "chat.completions"}
    ids = [r.response_id for r in records]
    duplicates = len(ids) - len(set(ids))
    missing = sum(i not in stored for i in ids)
    found = [r for r in records if r.response_id in stored]
    wrong_session = sum(stored[r.response_id]["session_id"] != r.session_id for r in found)
    by_turn = {(r.conversation, r.turn): r.response_id for r in found}
    later = [(stored[r.response_id], r) for r in found if r.turn > 0]
    linked = sum(
        row["parent_id"] is not None
        and row["parent_id"] == by_turn.get((r.conversation, r.turn - 1))
        for row, r in later
    )
    ok = len(records) == len(stored) and not (missing or wrong_session or duplicates)
    text = (
        f"{'PASS' if ok else 'FAIL'}: {len(records)} answered (HTTP 200), {len(stored)} chat "
        f"completions in the store, {missing} answered ids missing, {wrong_session} under "
        "the wrong session"
    )
    if duplicates:
        text += f", {duplicates} ids answered twice"
    if later:
        continues = sum(bool(row["tokens_continue_parent"]) for row, _ in later)
        text += (
            f"; later turns linked to their parent: {linked}/{len(later)}, "
            f"prompt tokens continue the parent's: {continues}/{len(later)}"
        )
    return ok, text


def profile_table(raw: Path) -> list[str]:
    """py-spy's raw stacks ("frame;frame;... count"), summed by the owner of the leaf."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        if any(mark in frames[-1] for mark in IDLE):
            continue  # idle: the loop waiting for the network, a thread waiting for work
        owner = next(
            (
                name
                for f in reversed(frames)
                for name, parts in OWNERS.items()
                if any(p in f for p in parts)
            ),
            "other",
        )
        counts[owner] += int(n)
    total = sum(counts.values()) or 1
    rows = [
        {"charged to": name, "share of busy samples": f"{100 * n / total:.0f}%"}
        for name, n in counts.most_common()
    ]
    return table(rows, "lr")


class Bench:
    def __init__(self, args: argparse.Namespace, children: Children) -> None:
        self.args = args
        self.children, self.work = children, children.log_dir
        self.pinned = can_pin(0, 1) and bool(shutil.which("taskset"))
        self.admin_key = "adm-" + secrets.token_hex(16)
        self.records: list[Record] = []
        self.conversations = 0
        self.runs: list[Run] = []
        self.profile: list[str] = []
        self.long_profile: list[str] = []
        self.long: list[Run] = []

    def pin(self, core: int) -> list[str]:
        """The prefix that pins a child to `core`, where this machine allows it."""
        return ["taskset", "-c", str(core)] if self.pinned else []

    async def conversations_for(self, path: str, url: str, n: int) -> list[Conversation]:
        if path == PASS:  # no session: nothing to record
            return [Conversation() for _ in range(n)]
        return await create_sessions(url, self.admin_key, n)

    def ran(self, path: str, n: int, res: LevelResult) -> None:
        """Count `n` conversations as used; keep the gateway's records for the store check."""
        self.conversations += n
        if path == GATEWAY:
            self.records += res.records

    async def measure(self, server: Child, path: str, url: str, sessions: int) -> Run:
        n = max(1, self.args.requests * (4 if sessions > 1 else 1) // self.args.turns)
        convs = await self.conversations_for(path, url, n)
        cpu0 = server.cpu_seconds()
        res = await run_level(
            url, sessions, convs, self.args.turns, first_conversation=self.conversations
        )
        run = Run(path, res, server.cpu_seconds() - cpu0)
        self.ran(path, n, res)
        print(
            f"{sessions:>3} sessions  {path:<13} {res.ok:>6} ok  {res.rps:7.0f} req/s  "
            f"p50 {res.pct(50):6.2f} ms  CPU {run.cpu_ms:6.2f} ms/req"
        )
        return run

    async def interleaved(self, servers: list[tuple[str, Child, str]]) -> None:
        """Each level through every path in turn, `--rounds` times: the machine's speed
        drifts over minutes, and both paths then see the same drift."""
        for path, server, url in servers:
            await self.measure(server, path, url, 4)  # warm-up, not reported
        for _ in range(self.args.rounds):
            for sessions in self.args.levels:
                for path, server, url in servers:
                    self.runs.append(await self.measure(server, path, url, sessions))
            if self.args.long:
                for sessions in self.args.levels:
                    for path, server, url in servers:
                        self.long.append(await self.long_run(server, path, url, sessions))
        path, server, url = servers[-1]  # the gateway, sampled apart from the figures
        top = max(self.args.levels)
        if self.args.profile:
            self.profile = await self.sampled(server, "", self.measure(server, path, url, top))
        if self.args.profile and self.args.long:
            long = self.long_run(server, path, url, top)
            self.long_profile = await self.sampled(server, "-long", long)
        self.runs, self.long = pooled(self.runs), pooled(self.long)

    async def sampled(self, server: Child, name: str, work: Awaitable[Run]) -> list[str]:
        """py-spy's samples of `server` while `work` runs, summed by library; its raw
        stacks stay in runs/bench/profile{name}.txt."""
        raw = ROOT / "runs" / "bench" / f"profile{name}.txt"
        raw.parent.mkdir(parents=True, exist_ok=True)
        # py-spy from PATH, else beside this interpreter (a venv that is not activated)
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        argv = [py_spy, "record", "--format", "raw", "-r", "100", "-p", str(server.pid)]
        spy = self.children.start(f"py-spy{name}", [*argv, "-o", str(raw)])
        try:
            await work
        finally:
            spy.stop(grace_s=60)  # SIGINT: py-spy writes its file then, not on SIGTERM
        return profile_table(raw)

    async def long_run(self, server: Child, path: str, url: str, sessions: int) -> Run:
        """`--long-turns`-turn sessions in lockstep; CPU per request read after each turn."""
        convs = await self.conversations_for(path, url, sessions)
        cpu_ms: list[float] = []
        last = [server.cpu_seconds()]

        def on_turn(_turn: int, answered: int) -> None:
            now = server.cpu_seconds()
            cpu_ms.append(1000.0 * (now - last[0]) / max(1, answered))
            last[0] = now

        res = await run_long(
            url, convs, self.args.long_turns, on_turn, first_conversation=self.conversations
        )
        self.ran(path, sessions, res)
        run = Run(path, res, 0.0, cpu_ms, server.proc.memory_info().rss)
        print(f"{sessions:>3} long sessions {path:<13} {res.ok:>5} ok  CPU ms/req by turns: "
              + ", ".join(f"{k} {v:.2f}" for k, v in run.buckets().items()))  # fmt: skip
        return run

    async def main(self) -> int:
        p_port, g_port = free_port(), free_port()
        engine_url = engine_server.start(self.children, prefix=self.pin(1))
        if self.pinned:
            os.sched_setaffinity(0, {1})
        argv = [sys.executable, "-m", "bench.passthrough", "--port", str(p_port),
                "--upstream", engine_url]  # fmt: skip
        proxy = self.children.start(PASS, [*self.pin(0), *argv], f"http://127.0.0.1:{p_port}/docs")
        db = self.work / "gateway.db"

        def serve(name: str, port: int, db: Path, *env: str) -> tuple[str, Child, str]:
            argv = [*self.pin(0), "env", *env, TURNSTILE, "serve", "--engine", "sglang",
                    "--engine-url", engine_url, "--port", str(port), "--database", str(db),
                    "--admin-key", self.admin_key]  # fmt: skip
            child = self.children.start(name, argv, f"http://127.0.0.1:{port}/healthz")
            return name, child, f"http://127.0.0.1:{port}/v1"

        paths = [(PASS, proxy, f"http://127.0.0.1:{p_port}/v1")]
        if self.args.also:  # its code first on the path; its records are not checked
            also = Path(self.args.also).resolve()
            paths.append(serve(f"gateway ({also.name})", free_port(), self.work / "also.db",
                               f"PYTHONPATH={also}"))  # fmt: skip
        paths.append(serve(GATEWAY, g_port, db))  # (last: --profile samples it)
        gateway = paths[-1][1]
        await self.interleaved(paths)
        proxy.stop()
        gateway.kill_hard()
        store_ok, store = check_store(db, self.records)
        print(store)
        section = self.short_section(store)
        failed = sum(r.result.failed for r in [*self.runs, *self.long])
        for r in [*self.runs, *self.long]:
            for error in r.result.errors[:2]:
                print(f"{r.path}, {r.result.concurrency} sessions: {error}")
        if failed or not store_ok:
            print(f"FAIL: {failed} failed requests; store check ok={store_ok}; docs untouched")
            return 1
        publish(self.args, section, *([self.long_section(db)] if self.long else []))
        return 0

    def long_section(self, db: Path) -> str:
        ref = {r.result.concurrency: r.buckets() for r in self.long if r.path == PASS}
        rows = []
        for r in self.long:
            b = r.buckets()
            first, last = list(b.values())[0], list(b.values())[-1]
            vs = last / list(ref[r.result.concurrency].values())[-1]
            rows.append(
                {"sessions": r.result.concurrency, "path": r.path}
                | {f"turns {k}": f"{v:.2f}" for k, v in b.items()}
                | {
                    "last / first": f"{last / first:.1f}x",
                    "vs pass-through, last turns": f"{vs:.2f}x",
                    "RSS after, MB": f"{r.rss / 2**20:.0f}",
                }
            )
        sessions = {rec.session_id for r in self.long for rec in r.result.records}
        stored, final = storage(db, sessions)
        shape = (f"{self.args.long_turns}-turn sessions in lockstep, every user turn a ~2 kB "
                 "tool-output block; CPU ms per request by turn:")  # fmt: skip
        stores = (f"Stored per long session: {stored / 1e6:.2f} MB; its final conversation "
                  f"(prompt + output ids + request): {final / 1e6:.2f} MB; ratio "
                  f"{stored / final:.2f}x.")  # fmt: skip
        blocks = [machine(), shape, table(rows, "rl" + "r" * (len(rows[0]) - 2)), stores]
        if self.long_profile:
            blocks += [
                f"py-spy, gateway, long sessions at {max(self.args.levels)}:",
                self.long_profile,
            ]
        return section("hot-path-long", "bench/hot_path.py --long", *blocks)

    def short_section(self, store: str) -> str:
        ref = {r.result.concurrency: r.cpu_ms for r in self.runs if r.path == PASS}
        rows = [
            {
                "sessions": r.result.concurrency,
                "path": r.path,
                "requests": r.result.ok,
                "req/s": f"{r.result.rps:.0f}",
                "p50 ms": f"{r.result.pct(50):.2f}",
                "p99 ms": f"{r.result.pct(99):.2f}",
                "CPU ms/req": f"{r.cpu_ms:.2f}",
                "CPU vs pass-through": f"{r.cpu_ms / ref[r.result.concurrency]:.2f}x",
            }
            for r in self.runs
        ]
        store = f"Store check after `kill -9` of the gateway: {store}"
        blocks = [machine(), table(rows, "rlrrrrrr"), store]
        if self.profile:
            blocks += [f"py-spy, gateway at {max(self.args.levels)} sessions:", self.profile]
        return section("hot-path", "bench/hot_path.py", *blocks)


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__, rounds=3)
    p.add_argument("--levels", default="1,16", help="concurrent sessions (default 1,16)")
    p.add_argument("--requests", type=int, default=800, help="at 1 session (4x that at more)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--profile", action="store_true", help="sample the gateway with py-spy")
    p.add_argument("--long", action="store_true", help="also run long sessions (see --long-turns)")
    p.add_argument("--long-turns", type=int, default=64)
    p.add_argument("--also", metavar="DIR", help="also measure the gateway of this checkout")
    args = p.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    with run_children("turnstile-hotpath-") as children:
        if rc := asyncio.run(Bench(args, children).main()):
            raise SystemExit(rc)  # (the servers' logs and the gateway's store stay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
