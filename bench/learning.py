"""Does `make demo` learn on every seed? Run it under several seeds and CPU conditions
and write the table docs/demo-run.md leads with.

    python -m bench.learning --seeds 1 2 3 4 5                  # both cores, torch's threads
    python -m bench.learning --seeds 6 7 --threads 1 --parallel 2   # one core each, side by side
    python -m bench.learning --seeds 8 9 10 --threads 1 --slow 38   # one core held to 38%
    python -m bench.learning --seeds 11 --slow 65 --core 1 --tag=-v2  # beside another run

Each run is the demo's own command (`turnstile train --config agents/math_multi_turn.yaml`)
with `seed=N` and its own run folder under `--out`. Results are appended to
`<out>/results.jsonl`, so invocations add up, and `<out>/table.md` is rewritten from all
of them. A run passes when its held-out accuracy after training is above the one before
with the two 95% intervals apart; the set passes when every run does and the median
gain is at least `--min-median-gain`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.procs import checkout_env
from bench.report import ROOT, read_jsonl

PROBE = re.compile(r"machine probe: ([0-9.]+) s")


def run_one(args: argparse.Namespace, seed: int, slot: int) -> dict[str, Any]:
    """One demo run; its row of the table."""
    tag = f"seed{seed}-t{args.threads}" + (f"-slow{args.slow}" if args.slow else "") + args.tag
    run_dir = Path(args.out) / tag
    command = [
        str(ROOT / ".venv/bin/turnstile"), "train", "--config", args.config,
        f"seed={seed}", f"run_dir={run_dir}", *args.overrides,
    ]  # fmt: skip
    if args.slow:
        command = [str(ROOT / "bench/slow_machine.sh"), "--core", str(slot), "--share",
                   str(args.slow), "--", *command]  # fmt: skip
    elif args.parallel > 1:
        command = ["taskset", "-c", str(slot % os.cpu_count()), *command]
    # DeepSpeed's CPU op built where `make` builds it, not in a folder other jobs share
    # (a job killed mid-build there leaves a lock that hangs every later run)
    ext = os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions"))
    env = checkout_env() | dict(TORCH_EXTENSIONS_DIR=ext, PYTHONUNBUFFERED="1")
    env["OMP_NUM_THREADS"] = str(args.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with (run_dir / "stdout.log").open("w") as log:
        rc = subprocess.run(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    wall = time.time() - started
    row = summarise(run_dir, wall)
    row.update(seed=seed, threads=args.threads, slow=args.slow or None, rc=rc, run_dir=str(run_dir))
    with (Path(args.out) / "results.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(format_row(row), flush=True)
    return row


def summarise(run_dir: Path, wall_s: float) -> dict[str, Any]:
    """What the run folder says: probe, steps, held-out before and after, and the
    lowest training reward over the second half of the steps."""
    text = (run_dir / "stdout.log").read_text(errors="replace")
    probe = PROBE.search(text)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    evals = read_jsonl(run_dir / "eval.jsonl")
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    half = rewards[len(rewards) // 2 :]
    out: dict[str, Any] = {
        "probe_s": float(probe.group(1)) if probe else None,
        "steps": len(rows),
        "wall_s": round(wall_s),
        "min_reward_second_half": min(half) if half else None,
        "collapse_warnings": text.count("looks like a collapse"),
    }
    if len(evals) >= 2:
        before, after = evals[0], evals[-1]
        out.update(
            before=before["accuracy"], before_ci=before["accuracy_ci"],
            after=after["accuracy"], after_ci=after["accuracy_ci"],
            gain=after["accuracy"] - before["accuracy"],
            apart=after["accuracy_ci"][0] > before["accuracy_ci"][1],
        )  # fmt: skip
    return out


def passed(row: dict[str, Any]) -> bool:
    return row.get("rc") == 0 and bool(row.get("apart")) and row.get("gain", 0) > 0


HEADER = (
    "| seed | threads | slow | probe s | steps | wall-clock | held-out before | after | gain "
    "| intervals | lowest training reward, 2nd half | collapse warnings |\n"
    "|---:|---:|---|---:|---:|---|---|---|---:|---|---:|---:|\n"
)


def format_row(r: dict[str, Any]) -> str:
    def acc(key: str) -> str:
        if key not in r:
            return "n/a"
        lo, hi = r[f"{key}_ci"]
        return f"{r[key]:.3f} [{lo:.3f}, {hi:.3f}]"

    low = r.get("min_reward_second_half")
    slow = f"{r['slow']}%" if r.get("slow") else "no"
    return (
        f"| {r['seed']} | {r['threads']} | {slow} "
        f"| {r.get('probe_s') or 'n/a'} | {r['steps']} "
        f"| {r['wall_s'] // 60} min {r['wall_s'] % 60} s | {acc('before')} | {acc('after')} "
        f"| {r.get('gain', float('nan')):+.3f} | {'apart' if r.get('apart') else 'OVERLAP'} "
        f"| {'n/a' if low is None else f'{low:.3f}'} | {r.get('collapse_warnings', 0)} |"
    )


def write_table(out: Path, min_median_gain: float) -> tuple[bool, str]:
    rows = read_jsonl(out / "results.jsonl")
    gains = [r.get("gain", float("-inf")) for r in rows]
    ok = bool(rows) and all(map(passed, rows)) and statistics.median(gains) >= min_median_gain
    verdict = (
        f"{sum(map(passed, rows))} of {len(rows)} runs gained with the intervals apart; "
        f"median gain {statistics.median(gains):+.3f}, worst {min(gains):+.3f}: "
        + ("PASS" if ok else "FAIL")
    ) if rows else "no runs"  # fmt: skip
    (out / "table.md").write_text(HEADER + "\n".join(map(format_row, rows)) + f"\n\n{verdict}\n")
    return ok, verdict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--threads", type=int, default=2, help="torch threads per run (OMP_NUM_THREADS)")
    p.add_argument("--parallel", type=int, default=1, help="runs at once, each pinned to a core")
    p.add_argument("--slow", type=int, default=0, help="bench/slow_machine.sh --share PCT")
    p.add_argument("--core", type=int, default=0, help="the first core runs are pinned to")
    p.add_argument("--tag", default="", help="a suffix for the run folders (e.g. -v2)")
    p.add_argument("--config", default="agents/math_multi_turn.yaml")
    p.add_argument("--out", default="runs/learning")
    p.add_argument("--min-median-gain", type=float, default=0.2)
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = p.parse_args(argv)
    if args.slow and args.parallel > 2:
        p.error("--slow pins each run to a core of its own: --parallel 2 at most")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(HEADER, end="", flush=True)
    width = max(1, args.parallel)
    slots = [args.core + i % width for i in range(len(args.seeds))]
    with ThreadPoolExecutor(width) as pool:
        list(pool.map(run_one, [args] * len(slots), args.seeds, slots))
    ok, verdict = write_table(Path(args.out), args.min_median_gain)
    print(verdict)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
