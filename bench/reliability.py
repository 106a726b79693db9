"""Replicas on one PostgreSQL under load and faults: the figures of docs/reliability.md.

Scenarios `load`, `kill` and `postgres` (docs/reliability.md, "Load held"); after each,
every 200 must be in the database under its session with its parent and its reward.

    python -m bench.reliability                 # all three, writes docs/reliability.md
    python -m bench.reliability --only load --runs 1 --no-docs
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.postgres import PostgresServer
from bench.replicas import Agents, Outcome, Replicas, lost_or_wrong, stored_completions
from bench.report import ROOT, arguments, measured_on, percentile, publish, section, table


@dataclass
class Row:
    scenario: str
    outcome: Outcome
    lost: int
    note: str = ""

    @property
    def statuses(self) -> Counter[int]:
        return Counter(s.status for s in self.outcome.sent)

    def cells(self) -> dict[str, object]:
        """Its row of docs/reliability.md's table, by column."""
        ok = self.outcome.ok
        lat = [s.latency_s * 1000 for s in ok]
        return {
            "scenario": self.scenario,
            "200s": len(ok),
            "lost": self.lost,
            "5xx": sum(v for k, v in self.statuses.items() if k >= 500),
            "p50 ms": f"{percentile(lat, 50):.0f}",
            "p99 ms": f"{percentile(lat, 99):.0f}",
            "req/s": f"{len(ok) / self.outcome.elapsed_s:.0f}",
            "retries same id / other": f"{self.outcome.retries_same_id} / "
            f"{len(self.outcome.retries_other_id)}",
            "notes": self.note,
        }


def check(scenario: str, replicas: Replicas, outcome: Outcome, note: str = "") -> Row:
    problems = lost_or_wrong(outcome, stored_completions(replicas.database))
    for p in problems[:10]:
        print("  LOST/WRONG", p)
    row = Row(scenario, outcome, len(problems), note)
    print(f"{scenario}: {row.statuses} lost={row.lost} in {outcome.elapsed_s:.1f} s")
    return row


def agents(args: argparse.Namespace, reps: Replicas, seed: int) -> Agents:
    """A scenario's agents: every fourth answered turn also re-sent as a client retry."""
    return Agents(reps, args.sessions, args.turns, retry_every=4, seed=seed)


async def a_third_in(agents: Agents) -> asyncio.Future[Outcome]:
    """The agents' run, once a third of its requests are answered: when a fault strikes."""
    run = asyncio.ensure_future(agents.run())
    while len(agents.outcome.sent) < agents.sessions * agents.turns // 3:
        await asyncio.sleep(0.05)
    return run


async def load(args: argparse.Namespace, pg: PostgresServer, reps: Replicas) -> list[Row]:
    rows = []
    for run in range(args.runs):
        rows.append(check(f"load, run {run + 1}", reps, await agents(args, reps, run).run()))
    return rows


async def kill(args: argparse.Namespace, pg: PostgresServer, reps: Replicas) -> list[Row]:
    team = agents(args, reps, 100)
    run = await a_third_in(team)
    team.down.add(0)
    reps.kill(0)
    outcome = await run
    restart_s = await asyncio.to_thread(reps.restart, 0)
    note = (f"replica 0 SIGKILLed after {args.sessions * args.turns // 3} answers; "
            f"{outcome.connection_errors} requests cut or refused, re-sent elsewhere; "
            f"restarted healthy in {restart_s:.1f} s")  # fmt: skip
    return [check("kill -9 of a replica", reps, outcome, note)]


async def postgres_outage(
    args: argparse.Namespace, pg: PostgresServer, reps: Replicas
) -> list[Row]:
    run = await a_third_in(agents(args, reps, 200))
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
    return [check(f"PostgreSQL down {args.outage_s:g} s", reps, outcome, note)]


SCENARIOS = {"load": load, "kill": kill, "postgres": postgres_outage}


def doc_section(args: argparse.Namespace, rows: list[Row]) -> str:
    cells = [r.cells() for r in rows]
    intro = (
        f"{measured_on()}, no GPU, other engineers' work running on the same cores: "
        f"`python -m bench.reliability` ({args.sessions} sessions x {args.turns} turns, "
        f"three `turnstile serve --engine fake --fake-delay-s {args.fake_delay_s:g}` "
        "replicas, PostgreSQL 15 with fsync on, all on this machine)."
    )
    legend = (
        "200s: answers received; lost: answers not in the database under their session with "
        "their parent and reward (must be 0); 5xx: final answers (after the client's retries) "
        "that were server errors; latency is per request as the agent saw it."
    )
    return section(
        "reliability", "bench/reliability.py", intro, table(cells, "l" * len(cells[0])), legend
    )


async def main_async(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="turnstile-reliability-"))
    rows: list[Row] = []
    with PostgresServer(fsync=True) as pg:
        for name in args.only or list(SCENARIOS):  # three replicas on a new database each
            extra = ["--fake-delay-s", str(args.fake_delay_s)]
            with Replicas(3, pg.create_database(), work / name, extra) as reps:
                rows += await SCENARIOS[name](args, pg, reps)
    publish(args, doc_section(args, rows), path=ROOT / "docs" / "reliability.md")
    print("logs:", work)
    return 1 if any(r.lost or any(k >= 500 for k in r.statuses) for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__)
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--turns", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--fake-delay-s", type=float, default=0.02)
    p.add_argument("--outage-s", type=float, default=10.0)
    p.add_argument("--only", action="append", choices=list(SCENARIOS))
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
