"""The gateway's added cost, measured against an engine that answers instantly.

One run, everything on 127.0.0.1:
  1. three servers start as separate processes, all pinned to core 0 (`taskset -c 0`):
     - *direct*: bench/fake_engine_server.py, a bare aiohttp server answering a fixed
       chat completion: the agent calling an instant engine without the gateway;
     - *FastAPI floor*: bench/fastapi_floor_server.py, the gateway's web stack
       (FastAPI + uvicorn) answering the same thing and doing nothing else;
     - *gateway*: `turnstile serve --engine fake` (the in-process FakeEngine answers
       instantly with real token ids; all the gateway's own work runs for real);
  2. this process pins itself to core 1 and drives each of them in turn with the same
     load (bench/load.py): 1, 16 and 64 concurrent sessions of 4-turn chats,
     non-streaming;
  3. it reads each server's CPU time (user + system, psutil) before and after each run:
     CPU ms per answered request; and the machine's, to notice other processes;
  4. with --profile it samples the gateway with py-spy under the largest load;
  5. with --gc-experiment it measures garbage-collector pauses, and gc.freeze();
  6. it kills the gateway with SIGKILL and checks that every 200 is in the store;
  7. it writes its section of docs/benchmarks.md (between markers; reruns replace it).

    python -m bench.run_gateway_bench                                # ~2 min on 2 cores
    python -m bench.run_gateway_bench --profile --gc-experiment      # ~3.5 min
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from bench import profile_summary
from bench.load import Conversation, LevelResult, Record, create_sessions, run_level
from bench.procs import Child, Children, can_pin, free_port
from bench.store_check import StoreCheck, check_store

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
OUT = ROOT / "runs" / "bench"
BEGIN = "<!-- BEGIN gateway-bench (written by bench/run_gateway_bench.py) -->"
END = "<!-- END gateway-bench -->"
CPU_TARGET_MS = 2.0
RPS_TARGET = 400.0
PROFILE_HZ = 100
FOREIGN_MAX = 0.05  # a level is measured again if other processes took more of the CPU

DIRECT, FLOOR, GATEWAY = "direct", "FastAPI floor", "gateway"
PATHS = (DIRECT, FLOOR, GATEWAY)


# ---- measurements ------------------------------------------------------------------------
@dataclass
class Run:
    """One path at one level: the load's result and the server's CPU time meanwhile."""

    result: LevelResult
    cpu_s: float
    loop_cpu_s: float  # the server's main thread (the gateway's event loop)
    foreign: float  # share of the machine's CPU that other processes took

    @property
    def cpu_ms(self) -> float:
        return 1000.0 * self.cpu_s / self.result.ok if self.result.ok else float("nan")

    @property
    def busy(self) -> float:
        """Share of one core the server used."""
        return self.cpu_s / self.result.wall_s if self.result.wall_s else float("nan")

    def thread_cpu_ms(self) -> dict[str, float]:
        """CPU ms/req of the event-loop thread and of all the other threads."""
        ok = self.result.ok or 1
        loop = 1000.0 * self.loop_cpu_s / ok
        return {profile_summary.LOOP: loop, profile_summary.OTHERS: self.cpu_ms - loop}

    def summary(self) -> dict[str, Any]:
        return self.result.summary() | {
            "server_cpu_ms_per_req": round(self.cpu_ms, 4),
            "server_loop_thread_cpu_ms_per_req": round(
                self.thread_cpu_ms()[profile_summary.LOOP], 4
            ),
            "server_core_busy": round(self.busy, 3),
            "foreign_cpu_share": round(self.foreign, 3),
        }


@dataclass
class Level:
    concurrency: int
    runs: dict[str, Run] = field(default_factory=dict)

    @property
    def foreign(self) -> float:
        return max((r.foreign for r in self.runs.values()), default=0.0)


@dataclass
class GcRun:
    """The GC experiment: the gateway under --gc-probe, with and without gc.freeze()."""

    label: str
    run: Run
    pauses: dict[int, list[float]]  # generation -> pause of each collection, ms

    def total_ms(self, gen: int | None = None) -> float:
        gens = [gen] if gen is not None else list(self.pauses)
        return sum(sum(self.pauses.get(g, [])) for g in gens)


def gc_log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def read_gc_log(path: Path, skip: int = 0) -> dict[int, list[float]]:
    """Pauses per generation from bench/gc_probe.py's log, after its first `skip` lines."""
    out: dict[int, list[float]] = {0: [], 1: [], 2: []}
    if path.exists():
        for line in gc_log_lines(path)[skip:]:
            gen, _, ms = line.partition(" ")
            if gen.isdigit() and ms:
                out.setdefault(int(gen), []).append(float(ms))
    return out


# ---- machine ---------------------------------------------------------------------------
def parse_requests(text: str, levels: list[int]) -> dict[int, int]:
    """'1:800,16:4000,64:4000' or one number for every level."""
    if ":" not in text:
        return {c: int(text) for c in levels}
    out = {int(k): int(v) for k, v in (part.split(":") for part in text.split(","))}
    missing = [c for c in levels if c not in out]
    if missing:
        raise SystemExit(f"--requests gives no count for concurrency {missing}")
    return out


def turnstile_bin() -> str:
    here = Path(sys.executable).parent / "turnstile"
    return str(here) if here.exists() else (shutil.which("turnstile") or "turnstile")


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    dirty = git("status", "--porcelain", "--untracked-files=no")
    packages = (
        "uvicorn fastapi starlette pydantic sqlalchemy tokenizers transformers aiohttp "
        "uvloop httptools"
    ).split()
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git("rev-parse", "--short", "HEAD")
        + (" + uncommitted changes" if dirty and dirty != "unknown" else ""),
        "cpu": model,
        "nproc": str(os.cpu_count()),
        "python": platform.python_version(),
        "packages": ", ".join(f"{p} {version(p)}" for p in packages),
    }


def machine_busy_s() -> float:
    """CPU seconds processes on the machine have used, over all cores.

    Interrupt time is left out: the loopback traffic of the benchmark itself is
    processed there, and charged to no process.
    """
    t = psutil.cpu_times()
    return t.user + t.nice + t.system


def own_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def wait_for_quiet(max_wait_s: float, threshold: float = 10.0, calm_s: float = 6.0) -> float:
    """Wait (up to `max_wait_s`) until the machine has been nearly idle for `calm_s`."""
    deadline = time.monotonic() + max_wait_s
    calm_since = time.monotonic()
    while True:
        busy = psutil.cpu_percent(interval=2.0)
        if busy >= threshold:
            calm_since = time.monotonic()
            print(f"waiting for a quiet machine: {busy:.0f}% of the CPU is busy")
        elif time.monotonic() - calm_since >= calm_s:
            return busy
        if time.monotonic() > deadline:
            print(f"warning: the machine did not stay idle for {calm_s:.0f} s; measuring anyway")
            return busy


# ---- the benchmark ---------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.command = command
        self.info = machine_info()
        self.workdir = Path(tempfile.mkdtemp(prefix="turnstile-bench-"))
        self.db = self.workdir / "bench.db"
        self.admin_key = "adm-" + secrets.token_hex(16)
        env = dict(os.environ)
        env.setdefault("TURNSTILE_CACHE", str(ROOT / ".cache"))
        env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.children = Children(self.workdir, env)
        self.pinned = False
        self.servers: dict[str, Child] = {}
        self.urls: dict[str, str] = {}
        self.gateway_argv: list[str] = []
        self.records: list[Record] = []  # every 200 the measured gateway gave
        self.conversations = 0  # conversation numbers are unique across the run
        self.levels: list[Level] = []
        self.profile: profile_summary.Profile | None = None
        self.profile_run: LevelResult | None = None
        self.gc_runs: list[GcRun] = []
        self.store: StoreCheck | None = None

    # ---- processes -------------------------------------------------------------------
    def taskset(self, argv: list[str]) -> list[str]:
        return ["taskset", "-c", str(self.args.server_core), *argv] if self.pinned else argv

    def serve_args(self, port: int, db: Path, admin_key: str) -> list[str]:
        return [
            "serve",
            "--engine",
            "fake",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--database",
            str(db),
            "--admin-key",
            admin_key,
        ]

    def start_servers(self) -> None:
        a = self.args
        self.pinned = can_pin(a.server_core, a.client_core) and bool(shutil.which("taskset"))
        if not self.pinned:
            print(f"warning: cannot pin to cores {a.server_core}/{a.client_core}: unpinned")
        py = sys.executable
        ports = {p: free_port() for p in PATHS}
        self.gateway_argv = self.taskset(
            [turnstile_bin(), *self.serve_args(ports[GATEWAY], self.db, self.admin_key)]
        )
        argvs = {
            DIRECT: self.taskset(
                [py, "-m", "bench.fake_engine_server", "--port", str(ports[DIRECT])]
            ),
            FLOOR: self.taskset(
                [py, "-m", "bench.fastapi_floor_server", "--port", str(ports[FLOOR])]
            ),
            GATEWAY: self.gateway_argv,
        }
        for path, argv in argvs.items():
            self.servers[path] = self.children.start(path.replace(" ", "-").lower(), argv)
            self.urls[path] = f"http://127.0.0.1:{ports[path]}/v1"
        for path, child in self.servers.items():
            child.wait_http(self.urls[path].removesuffix("/v1") + "/healthz")
        if self.pinned:
            os.sched_setaffinity(0, {a.client_core})

    def ours(self) -> float:
        return own_cpu_s() + sum(c.cpu_seconds() for c in self.servers.values() if c.alive())

    # ---- load ------------------------------------------------------------------------
    async def sessions(self, url: str, requests: int, admin_key: str) -> list[Conversation]:
        """Gateway sessions for `requests` requests, opened before the measured window."""
        n = max(1, requests // self.args.turns)
        return await create_sessions(url, admin_key, n)

    async def load(
        self, url: str, target: str, concurrency: int, convs: list[Conversation]
    ) -> LevelResult:
        res = await run_level(
            url, target, concurrency, convs, self.args.turns, first_conversation=self.conversations
        )
        self.conversations += len(convs)
        return res

    async def measure(
        self,
        server: Child,
        url: str,
        target: str,
        concurrency: int,
        requests: int,
        admin_key: str | None = None,
    ) -> Run:
        n = max(1, requests // self.args.turns)
        if admin_key is not None:
            convs = await self.sessions(url, requests, admin_key)  # not measured
        else:
            convs = [Conversation() for _ in range(n)]
        x0, o0 = machine_busy_s(), self.ours()
        c0, m0 = server.cpu_seconds(), server.main_thread_cpu_seconds()
        res = await self.load(url, target, concurrency, convs)
        c1, m1 = server.cpu_seconds(), server.main_thread_cpu_seconds()
        x1, o1 = machine_busy_s(), self.ours()
        foreign = max(0.0, (x1 - x0) - (o1 - o0)) / (res.wall_s * (os.cpu_count() or 1))
        if res.failed:
            print(f"  {target} c={concurrency}: {res.failed} failed: {res.errors[:3]}")
        return Run(res, c1 - c0, m1 - m0, foreign)

    async def measure_level(self, c: int, requests: int) -> Level:
        lvl = Level(c)
        for path in PATHS:
            key = self.admin_key if path == GATEWAY else None
            run = await self.measure(self.servers[path], self.urls[path], path, c, requests, key)
            lvl.runs[path] = run
            if path == GATEWAY:
                self.records += run.result.records
        d, f, g = (lvl.runs[p] for p in PATHS)
        print(
            f"c={c:3d}  req/s direct {d.result.rps:6.0f} floor {f.result.rps:5.0f} gateway "
            f"{g.result.rps:4.0f} | p50/p99 ms direct {d.result.pct(50):.2f}/"
            f"{d.result.pct(99):.2f} gateway {g.result.pct(50):.2f}/{g.result.pct(99):.2f} | "
            f"CPU ms/req floor {f.cpu_ms:.2f} gateway {g.cpu_ms:.2f} "
            f"(loop {g.thread_cpu_ms()[profile_summary.LOOP]:.2f}) | "
            f"others {100 * lvl.foreign:.0f}%"
        )
        return lvl

    async def run_levels(self) -> None:
        a = self.args
        counts = parse_requests(a.requests, a.levels)
        print(f"warm-up: {a.warmup} requests on each path")
        for path in PATHS:
            key = self.admin_key if path == GATEWAY else None
            run = await self.measure(self.servers[path], self.urls[path], path, 8, a.warmup, key)
            if path == GATEWAY:
                self.records += run.result.records
        for c in a.levels:
            for attempt in range(a.retries + 1):
                lvl = await self.measure_level(c, counts[c])
                if lvl.foreign <= FOREIGN_MAX or attempt == a.retries:
                    break
                print(f"  other processes took {100 * lvl.foreign:.0f}% of the CPU: again")
                if a.quiet_wait > 0:
                    wait_for_quiet(a.quiet_wait)
            self.levels.append(lvl)

    async def run_profile(self) -> None:
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(pyspy).exists():
            raise SystemExit("--profile needs py-spy: pip install py-spy")
        c = max(self.args.levels)
        url = self.urls[GATEWAY]
        sessions = await self.sessions(url, self.args.profile_requests, self.admin_key)
        raw = self.workdir / "gateway.pyspy.txt"
        argv = [pyspy, "record", "--pid", str(self.servers[GATEWAY].pid)]
        argv += ["--rate", str(PROFILE_HZ), "--format", "raw", "--output", str(raw)]
        spy = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            await asyncio.sleep(1.0)  # let py-spy attach
            t0 = time.perf_counter()
            self.profile_run = await self.load(url, "gateway+py-spy", c, sessions)
            self.records += self.profile_run.records
            print(
                f"profiled run: {self.profile_run.ok} requests in "
                f"{time.perf_counter() - t0:.1f} s (py-spy pauses the gateway at each sample)"
            )
        finally:
            spy.send_signal(signal.SIGINT)
            try:
                _, err = spy.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
                _, err = spy.communicate()
        if not raw.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-2000:]}")
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(raw, OUT / "gateway.pyspy.txt")
        self.profile = profile_summary.summarise(raw)
        print(f"profile: {self.profile.busy} busy samples; raw stacks in runs/bench/")

    async def run_gc_experiment(self) -> None:
        """The gateway again, under bench/gc_probe.py: GC pauses, then with gc.freeze()."""
        c = max(self.args.levels)
        n = parse_requests(self.args.requests, self.args.levels)[c]
        for label, freeze in (("gateway (GC logged)", False), ("gateway + gc.freeze()", True)):
            tag = "freeze" if freeze else "plain"
            db, log, port = (
                self.workdir / f"gc-{tag}.db",
                self.workdir / f"gc-{tag}.gclog",
                free_port(),
            )
            argv = [sys.executable, "-m", "bench.gc_probe", "--log", str(log)]
            argv += ["--freeze"] if freeze else []
            argv += self.serve_args(port, db, self.admin_key)
            child = self.children.start(f"gc-{tag}", self.taskset(argv))
            url = f"http://127.0.0.1:{port}/v1"
            try:
                child.wait_http(f"http://127.0.0.1:{port}/healthz")
                await self.load(url, "warm-up", 8, await self.sessions(url, 400, self.admin_key))
                if self.args.quiet_wait > 0:
                    wait_for_quiet(self.args.quiet_wait)
                child.popen.send_signal(signal.SIGUSR1)  # flush: count only what follows
                await asyncio.sleep(0.3)
                skip = len(gc_log_lines(log))
                run = await self.measure(child, url, label, c, n, self.admin_key)
            finally:
                child.stop()
            gc_run = GcRun(label, run, read_gc_log(log, skip))
            self.gc_runs.append(gc_run)
            p2 = gc_run.pauses.get(2, [])
            print(
                f"{label}: {run.result.rps:.0f} req/s, p50 {run.result.pct(50):.1f} ms, "
                f"p99 {run.result.pct(99):.1f} ms, {run.cpu_ms:.2f} CPU ms/req; "
                f"{len(p2)} full collections, {sum(p2):.0f} ms in all, "
                f"longest {max(p2, default=0):.0f} ms"
            )

    # ---- the whole run ---------------------------------------------------------------
    def run(self) -> int:
        if self.args.quiet_wait > 0:
            wait_for_quiet(self.args.quiet_wait)
        try:
            self.start_servers()
            asyncio.run(self.run_levels())
            if self.args.profile:
                asyncio.run(self.run_profile())
            # A 200 means the record was committed: it must survive a crash.
            self.servers[GATEWAY].kill_hard()
            self.store = check_store(self.db, self.records)
            print("store check:", self.store.describe())
            if self.args.gc_experiment:
                for path in (DIRECT, FLOOR):
                    self.servers[path].stop()
                asyncio.run(self.run_gc_experiment())
        finally:
            self.children.stop_all()
            if self.args.keep:
                print(f"kept {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
        failed = [
            f"{p} c={lvl.concurrency}: {r.result.failed} failed"
            for lvl in self.levels
            for p, r in lvl.runs.items()
            if r.result.failed
        ]
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "gateway_bench.json").write_text(json.dumps(self.to_json(), indent=2))
        if not self.store.ok or failed:
            print("\n" + "!" * 78)
            print("BENCHMARK FAILED:", self.store.describe(), *failed, sep="\n  ")
            print("!" * 78)
            print("docs not updated; results in runs/bench/gateway_bench.json")
            return 1
        if self.args.write_docs:
            write_section(DOC, self.markdown())
            print(f"wrote {DOC.relative_to(ROOT)}")
        return 0

    # ---- reporting -------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.info,
            "command": self.command,
            "gateway_command": self.gateway_argv,
            "levels": [
                {"concurrency": lvl.concurrency} | {p: r.summary() for p, r in lvl.runs.items()}
                for lvl in self.levels
            ],
            "store_check": self.store.describe() if self.store else None,
            "profile": self.profile.to_json() if self.profile else None,
            "gc_experiment": [
                {
                    "label": g.label,
                    "run": g.run.summary(),
                    "collections": {gen: len(v) for gen, v in g.pauses.items()},
                    "pause_ms": {gen: round(sum(v), 1) for gen, v in g.pauses.items()},
                }
                for g in self.gc_runs
            ],
        }

    def markdown(self) -> str:
        i, a = self.info, self.args
        gw_cmd = shlex.join(["KEY" if x == self.admin_key else x for x in self.gateway_argv])
        gw_cmd = gw_cmd.replace(str(self.db), "/tmp/turnstile-bench-XXXX/bench.db")
        gw_cmd = gw_cmd.replace(str(Path(sys.executable).parent) + "/", ".venv/bin/")
        lines = [
            BEGIN,
            "",
            f"Measured {i['date']} at commit `{i['commit']}` on {i['nproc']} cores "
            f"({i['cpu']}), Python {i['python']}.",
            "",
            f"- Command: `{self.command}`",
            f"- Gateway: `{gw_cmd}`",
            f"- Packages: {i['packages']}",
            f"- Servers pinned to core {a.server_core}, the load generator (aiohttp, one "
            f"process) to core {a.client_core}"
            + ("" if self.pinned else " (**not pinned**: taskset or cores unavailable)")
            + f". Each session runs {a.turns} turns, sending the whole history each turn, "
            "non-streaming, `max_tokens` 32; the answer is 7 tokens. Requests per level and "
            f"path: `{a.requests}`, after {a.warmup} warm-up requests per path.",
            "- Paths: *direct* = the agent calls `bench/fake_engine_server.py` (bare aiohttp, "
            "answers instantly); *FastAPI floor* = `bench/fastapi_floor_server.py`, the "
            "gateway's web stack (FastAPI + uvicorn, same settings) answering the same "
            "thing and doing nothing else; *gateway* = `turnstile serve --engine fake` (the "
            "in-process FakeEngine answers instantly with real token ids; template "
            "rendering, tokenising, parent linking and the durable SQLite record run for "
            "real).",
            "- *server CPU ms/req*: the server process's user+system CPU time (psutil, all "
            "threads) over the run, divided by the requests it answered. Latency is measured "
            "by the agent, request sent to answer read.",
            "",
            "| sessions | path | requests | req/s | p50 ms | p99 ms | server CPU ms/req "
            "| server core busy | load-gen core busy |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for lvl in self.levels:
            for path, run in lvl.runs.items():
                res = run.result
                lines.append(
                    f"| {lvl.concurrency} | {path} | {res.ok} | {res.rps:.0f} | "
                    f"{res.pct(50):.2f} | {res.pct(99):.2f} | {run.cpu_ms:.2f} | "
                    f"{100 * run.busy:.0f}% | {100 * res.client_cpu_s / res.wall_s:.0f}% |"
                )
        lines += [
            "",
            "The gateway's added cost over calling the engine directly, and the targets of "
            f"DESIGN.md (≤ {CPU_TARGET_MS:.1f} ms of gateway CPU per completion; "
            f"> {RPS_TARGET:.0f} req/s on one gateway core at 16 and 64 sessions):",
            "",
            "| sessions | added p50 ms | added p99 ms | gateway CPU ms/req (event loop + "
            "other threads) | CPU target | gateway req/s | req/s target |",
            "|---:|---:|---:|---:|---|---:|---|",
        ]
        for lvl in self.levels:
            g, d = lvl.runs[GATEWAY], lvl.runs[DIRECT]
            split = g.thread_cpu_ms()
            cpu_ok = "met" if g.cpu_ms <= CPU_TARGET_MS else "**missed**"
            rps_ok = (
                "n/a (latency-bound)"
                if lvl.concurrency < 16
                else ("met" if g.result.rps > RPS_TARGET else "**missed**")
            )
            lines.append(
                f"| {lvl.concurrency} | {g.result.pct(50) - d.result.pct(50):+.2f} | "
                f"{g.result.pct(99) - d.result.pct(99):+.2f} | {g.cpu_ms:.2f} "
                f"({split[profile_summary.LOOP]:.2f} + {split[profile_summary.OTHERS]:.2f}) | "
                f"{cpu_ok} | {g.result.rps:.0f} | {rps_ok} |"
            )
        foreign = max((lvl.foreign for lvl in self.levels), default=0.0)
        quiet = (
            f"Other processes took at most {100 * foreign:.0f}% of the machine's CPU during "
            "the measured runs"
        )
        if foreign > FOREIGN_MAX:
            quiet = f"**{quiet}: the machine was not quiet; these figures are pessimistic**"
        lines += [
            "",
            f"{quiet}.",
            "",
            f"Store check (after `kill -9` of the gateway): {self.store.describe()}.",
            "",
        ]
        if self.gc_runs:
            lines += self.gc_markdown()
        if self.profile is not None and self.profile_run is not None:
            c = self.profile_run.concurrency
            ref = next((lvl for lvl in self.levels if lvl.concurrency == c), None)
            cpu_ms = ref.runs[GATEWAY].thread_cpu_ms() if ref else None
            lines += self.profile.markdown(c, cpu_ms, PROFILE_HZ)
        lines.append(END)
        return "\n".join(lines) + "\n"

    def gc_markdown(self) -> list[str]:
        c = self.gc_runs[0].run.result.concurrency
        lines = [
            f"Garbage-collector pauses ({c} sessions; the gateway run by `bench/gc_probe.py`, "
            "which logs every collection through `gc.callbacks`; `gc.freeze()` = the same "
            "after freezing everything imported at start-up):",
            "",
            "| gateway | req/s | p50 ms | p99 ms | CPU ms/req | full (gen 2) collections "
            "| their pauses, total / longest ms | gen 0+1 pauses, total ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for g in self.gc_runs:
            res, p2 = g.run.result, g.pauses.get(2, [])
            lines.append(
                f"| {g.label} | {res.rps:.0f} | {res.pct(50):.1f} | {res.pct(99):.1f} | "
                f"{g.run.cpu_ms:.2f} | {len(p2)} | {sum(p2):.0f} / {max(p2, default=0):.0f} | "
                f"{g.total_ms(0) + g.total_ms(1):.0f} |"
            )
        lines.append("")
        return lines


def write_section(path: Path, section: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace the text between the markers (or append it) and keep the rest."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Gateway overhead vs. an instant engine.")
    p.add_argument("--levels", default="1,16,64", help="concurrent sessions (default 1,16,64)")
    p.add_argument(
        "--requests",
        default="1:3000,16:10000,64:10000",
        help="requests per level and path: 'C:N,...' or one N for all (default %(default)s)",
    )
    p.add_argument("--turns", type=int, default=4, help="turns per session (default 4)")
    p.add_argument("--warmup", type=int, default=400, help="warm-up requests per path")
    p.add_argument("--profile", action="store_true", help="also sample the gateway with py-spy")
    p.add_argument("--profile-requests", type=int, default=6000)
    p.add_argument(
        "--gc-experiment",
        action="store_true",
        help="also measure GC pauses, and the gateway with gc.freeze() (bench/gc_probe.py)",
    )
    p.add_argument("--server-core", type=int, default=0)
    p.add_argument("--client-core", type=int, default=1)
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        help="measure a level again (at most this often) if other processes were busy",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=180.0,
        metavar="S",
        help="wait up to S seconds for an idle machine before measuring (default %(default)s)",
    )
    p.add_argument("--no-docs", dest="write_docs", action="store_false", help="leave docs alone")
    p.add_argument("--keep", action="store_true", help="keep the databases and server logs")
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    args.levels = [int(x) for x in args.levels.split(",")]

    def on_term(*_: object) -> None:
        raise SystemExit(143)  # unwinds through `finally`: the children are stopped

    signal.signal(signal.SIGTERM, on_term)
    command = " ".join(["python -m bench.run_gateway_bench", shlex.join(given)]).strip()
    return Bench(args, command).run()


if __name__ == "__main__":
    sys.exit(main())
