"""Replicas on one PostgreSQL under load and faults: the figures of docs/reliability.md.

Three `turnstile serve --engine fake` replicas share one throwaway PostgreSQL server
(fsync on). Agents send each request of a session to a random replica, post a reward
for every answer (twice, through two other replicas, racing the next turns), and
re-send every fourth turn as a retry to another replica. Scenarios:

- load: `--sessions` x `--turns` x `--runs`; lost records, 5xx, p50/p99, requests/s;
- kill: one replica SIGKILLed a third of the way in; the others keep serving; it restarts;
- postgres: the server stopped for `--outage-s` seconds under load, then started again.

After each, every request answered 200 must be in the database under its session with
its parent and its reward.

    python -m bench.reliability                 # all three, writes docs/reliability.md
    python -m bench.reliability --only load --runs 1 --no-docs
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.postgres import PostgresServer
from bench.replicas import Agents, Outcome, Replicas, lost_or_wrong, percentile, stored_completions
from bench.report import write_section

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
BEGIN = "<!-- BEGIN reliability (written by bench/reliability.py) -->"
END = "<!-- END reliability -->"


@dataclass
class Row:
    scenario: str
    outcome: Outcome
    lost: int
    note: str = ""

    @property
    def statuses(self) -> Counter[int]:
        return Counter(s.status for s in self.outcome.sent)

    def cells(self) -> list[str]:
        lat = [s.latency_s * 1000 for s in self.outcome.ok]
        n5xx = sum(v for k, v in self.statuses.items() if k >= 500)
        return [
            self.scenario,
            str(len(self.outcome.ok)),
            str(self.lost),
            str(n5xx),
            f"{percentile(lat, 0.5):.0f}",
            f"{percentile(lat, 0.99):.0f}",
            f"{len(self.outcome.ok) / self.outcome.elapsed_s:.0f}",
            f"{self.outcome.retries_same_id} / {len(self.outcome.retries_other_id)}",
            self.note,
        ]


def _check(scenario: str, replicas: Replicas, outcome: Outcome, note: str = "") -> Row:
    problems = lost_or_wrong(outcome, stored_completions(replicas.database))
    for p in problems[:10]:
        print("  LOST/WRONG", p)
    row = Row(scenario, outcome, len(problems), note)
    print(f"{scenario}: {row.statuses} lost={row.lost} in {outcome.elapsed_s:.1f} s")
    return row


async def load(args: argparse.Namespace, pg: PostgresServer, work: Path) -> list[Row]:
    rows = []
    with Replicas(3, pg.create_database(), work / "load", _serve_args(args)) as replicas:
        for run in range(args.runs):
            agents = Agents(replicas, args.sessions, args.turns, retry_every=4, seed=run)
            rows.append(_check(f"load, run {run + 1}", replicas, await agents.run()))
    return rows


async def kill(args: argparse.Namespace, pg: PostgresServer, work: Path) -> list[Row]:
    with Replicas(3, pg.create_database(), work / "kill", _serve_args(args)) as replicas:
        agents = Agents(replicas, args.sessions, args.turns, retry_every=4, seed=100)
        run = asyncio.ensure_future(agents.run())
        while len(agents.outcome.sent) < args.sessions * args.turns // 3:
            await asyncio.sleep(0.05)
        agents.down.add(0)
        replicas.kill(0)
        outcome = await run
        restart_s = await asyncio.to_thread(replicas.restart, 0)
        note = (f"replica 0 SIGKILLed after {args.sessions * args.turns // 3} answers; "
                f"{outcome.connection_errors} requests cut or refused, re-sent elsewhere; "
                f"restarted healthy in {restart_s:.1f} s")  # fmt: skip
        return [_check("kill -9 of a replica", replicas, outcome, note)]


async def postgres_outage(args: argparse.Namespace, pg: PostgresServer, work: Path) -> list[Row]:
    with Replicas(3, pg.create_database(), work / "pg", _serve_args(args)) as replicas:
        agents = Agents(replicas, args.sessions, args.turns, retry_every=4, seed=200)
        run = asyncio.ensure_future(agents.run())
        while len(agents.outcome.sent) < args.sessions * args.turns // 3:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(pg.stop, "immediate")
        await asyncio.sleep(args.outage_s)
        began = time.monotonic()
        await asyncio.to_thread(pg.start)
        start_s = time.monotonic() - began
        outcome = await run
        refused = Counter(s.code for s in outcome.sent if s.status != 200)
        note = (f"PostgreSQL stopped (immediate), started again {args.outage_s:g} s later "
                f"(its start and crash recovery took {start_s:.1f} s more): "
                f"{outcome.refused_503} responses (chat, reward, retry) were 503 "
                f"`store_unavailable` with `retry-after`, each retried by its client; "
                f"{outcome.connection_errors} connection errors; "
                f"final non-200: {dict(refused) or 0}; no gateway restarted")  # fmt: skip
        return [_check(f"PostgreSQL down {args.outage_s:g} s", replicas, outcome, note)]


def _serve_args(args: argparse.Namespace) -> list[str]:
    return ["--fake-delay-s", str(args.fake_delay_s)]


SCENARIOS = {"load": load, "kill": kill, "postgres": postgres_outage}


def section(args: argparse.Namespace, rows: list[Row], when: str) -> str:
    head = ["scenario", "200s", "lost", "5xx", "p50 ms", "p99 ms", "req/s",
            "retries same id / other", "notes"]  # fmt: skip
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    table += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join([
        BEGIN, "",
        f"Measured {when} on a {os.cpu_count()}-core VM ({platform.processor() or 'x86_64'}), "
        f"no GPU, Python {platform.python_version()}, other engineers' work running on the "
        f"same cores: `python -m bench.reliability` ({args.sessions} sessions x "
        f"{args.turns} turns, three `turnstile serve --engine fake --fake-delay-s "
        f"{args.fake_delay_s:g}` replicas, PostgreSQL 15 with fsync on, all on this VM).",
        "", *table, "",
        "200s: answers received; lost: answers not in the database under their session with "
        "their parent and reward (must be 0); 5xx: final answers (after the client's retries) "
        "that were server errors; latency is per request as the agent saw it.", "", END,
    ])  # fmt: skip


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="turnstile-reliability-"))
    rows: list[Row] = []
    with PostgresServer(fsync=True) as pg:
        for name in args.only or list(SCENARIOS):
            rows += await SCENARIOS[name](args, pg, work)
    when = time.strftime("%Y-%m-%d", time.gmtime())
    failed = [r for r in rows if r.lost or any(k >= 500 for k in r.statuses)]
    if args.write_docs:
        write_section(DOC, section(args, rows, when), BEGIN, END)
    print("logs:", work)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--turns", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--fake-delay-s", type=float, default=0.02)
    p.add_argument("--outage-s", type=float, default=10.0)
    p.add_argument("--only", action="append", choices=list(SCENARIOS))
    p.add_argument("--no-docs", dest="write_docs", action="store_false")
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
