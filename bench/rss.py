"""Gateway memory behind an external engine: how small it starts, and whether it stays flat.

`--sessions` short sessions through `turnstile serve` in front of bench/engine_server.py,
RSS read at checkpoints; the method and targets: docs/benchmarks.md, "Memory behind an
external engine".

    python -m bench.rss                  # 20,000 sessions, ~3 min on 2 cores
    python -m bench.rss --sessions 4000 --no-docs
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp

from bench import engine_server
from bench.load import create_session
from bench.procs import Child, run_children
from bench.replicas import Replicas
from bench.report import arguments, measured_on, publish, section, table

SYSTEM = "You are a careful assistant. Answer briefly and show your work. " * 5


async def one_session(
    http: aiohttp.ClientSession, url: str, admin: str, n: int, turns: int
) -> None:
    sid, key = await create_session(http, url, admin, metadata={"n": n})
    auth = {"Authorization": f"Bearer {key}"}
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Session {n}, question {turn}: 2+{turn}?"})
        req = {"model": "default", "messages": messages, "max_tokens": 16, "logprobs": True}
        async with http.post(f"{url}/chat/completions", headers=auth, json=req) as r:
            r.raise_for_status()
            reply = await r.json()
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    async with http.post(f"{url}/sessions/{sid}/end", headers=auth) as r:
        r.raise_for_status()


def rss_mb(server: Child) -> float:
    return server.proc.memory_info().rss / 2**20


async def drive(
    server: Child, url: str, admin: str, args: argparse.Namespace, checkpoints: set[int]
) -> dict[int, float]:
    """RSS in MB when the number of finished sessions reaches each checkpoint."""
    rss: dict[int, float] = {}
    done = 0
    next_n = iter(range(args.sessions))
    began = time.perf_counter()

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal done
        for n in next_n:
            await one_session(http, url, admin, n, args.turns)
            done += 1
            if done in checkpoints:
                rss[done] = rss_mb(server)
                print(f"{done:>6} sessions  RSS {rss[done]:7.1f} MB  "
                      f"{time.perf_counter() - began:6.0f} s", flush=True)  # fmt: skip

    conn = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(60)) as http:
        await asyncio.gather(*(worker(http) for _ in range(args.concurrency)))
    return rss


def heavy_files(server: Child) -> list[str]:
    """torch's or transformers' files mapped into the server (none behind an external engine)."""
    mapped = {m.path for m in server.proc.memory_maps()}
    return sorted(p for p in mapped if "/torch/" in p or "/transformers/" in p)


def doc_section(
    args: argparse.Namespace, start: dict[str, float], heavy: list[str], rss: dict[int, float]
) -> str:
    first, last = rss[args.first], rss[args.sessions]
    engine = "`turnstile serve --engine fake`"
    if args.engine == "external":
        engine = "`turnstile serve --engine sglang` in front of bench/engine_server.py"
    return section(
        "rss",
        "bench/rss.py",
        f"{measured_on()}, no GPU: `python -m bench.rss --engine {args.engine} --sessions "
        f"{args.sessions} --turns {args.turns} --concurrency {args.concurrency}` ({engine}, "
        "default cache bounds).",
        f"Ready: **{start['ready']:.1f} MB**; after its first session: "
        f"**{start['first']:.1f} MB** (target: at most 150 MB); torch or transformers "
        f"files mapped: {len(heavy)}.",
        table(
            [
                {"sessions finished": f"{n:,}", "gateway RSS, MB": f"{mb:.1f}"}
                for n, mb in sorted(rss.items())
            ],
            "rr",
        ),
        f"RSS after {args.sessions:,} sessions: **{last:.1f} MB** (target: at most 150 MB); "
        f"/ after {args.first:,}: **{last / first:.3f}x** (target: within 10%).",
    )


async def main_async(args: argparse.Namespace) -> int:
    with run_children("turnstile-rss-") as children:
        engine: list[str] = []  # Replicas' own: --engine fake
        if args.engine == "external":
            engine = ["--engine", "sglang", "--engine-url", engine_server.start(children)]
        db = str(children.log_dir / "gateway.db")
        with Replicas(1, db, children.log_dir, engine) as reps:
            server, url, admin = reps.procs[0], reps.urls[0], reps.admin_key
            start = {"ready": rss_mb(server)}
            async with aiohttp.ClientSession() as http:
                await one_session(http, url, admin, -1, args.turns)
            start["first"] = rss_mb(server)
            heavy = heavy_files(server)
            print(f"ready {start['ready']:.1f} MB, after one session {start['first']:.1f} MB; "
                  f"torch/transformers files mapped: {heavy or 'none'}", flush=True)  # fmt: skip
            every = range(args.every, args.sessions + 1, args.every)
            rss = await drive(server, url, admin, args, {args.first, args.sessions, *every})
    ratio = rss[args.sessions] / rss[args.first]
    print(f"RSS {args.sessions} / {args.first} sessions: {ratio:.3f}x")
    publish(args, doc_section(args, start, heavy, rss))
    small = args.engine != "external" or (
        max(start["first"], rss[args.sessions]) <= 150 and not heavy
    )
    return 0 if ratio <= 1.10 and small else 1


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__)
    engines = "external: SGLang's protocol from bench/engine_server.py; fake: in-process"
    p.add_argument("--engine", choices=("external", "fake"), default="external", help=engines)
    p.add_argument("--sessions", type=int, default=20_000)
    p.add_argument("--first", type=int, default=2_000, help="the reference checkpoint")
    p.add_argument("--every", type=int, default=2_000, help="also read RSS every this many")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
