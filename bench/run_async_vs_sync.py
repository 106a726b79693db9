"""Async (max_staleness 1) against synchronous (0) training: wall-clock on the same run.

Both runs train the demo (agents/math_multi_turn.yaml) for the same steps, each as its
own `turnstile train` process; async collects the next batch while the current one
trains. Writes its section of docs/benchmarks.md and runs/bench/async_vs_sync.json.

    python -m bench.run_async_vs_sync               # ~10 min on 2 cores
    python -m bench.run_async_vs_sync --steps 4     # quicker
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.report import ROOT, arguments, measured_on, publish, read_jsonl, section, table


def run(mode: str, staleness: int, steps: int, out: Path) -> dict:
    run_dir = out / mode
    cmd = [
        sys.executable, "-m", "trainer.cli", "train", "--config", "agents/math_multi_turn.yaml",
        f"run_dir={run_dir}", f"total_steps={steps}", f"rollout.max_staleness={staleness}",
        "tensorboard=false", "checkpoint_every=0",
    ]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    later = rows[1:] or rows  # the first step pays for start-up in both modes

    per_step = ("step_s", "rollout_wait_s", "train_s", "staleness_mean")
    means = {k: statistics.fmean(r.get(k) or 0.0 for r in later) for k in per_step}
    return {
        "mode": mode,
        "max_staleness": staleness,
        "steps": steps,
        "wall_s": wall,
        "loop_s": sum(r["step_s"] for r in rows),
        **means,
        "reward_first": rows[0]["reward_mean"],
        "reward_last": rows[-1]["reward_mean"],
        "reward_mean": sum(r["reward_mean"] or 0 for r in rows) / len(rows),
    }


COLUMNS = {  # the table's header: how a run's figures show in it
    "run": "{mode}",
    "max_staleness": "{max_staleness}",
    "whole run (s)": "{wall_s:.0f}",
    "training loop (s)": "{loop_s:.0f}",
    "s/step after the first": "{step_s:.1f}",
    "waiting for rollouts (s/step)": "{rollout_wait_s:.1f}",
    "DeepSpeed step (s/step)": "{train_s:.1f}",
    "mean staleness": "{staleness_mean:.2f}",
    "mean reward": "{reward_mean:.3f}",
}


def doc_section(results: list[dict], steps: int) -> str:
    sync, asyn = results
    rows = [{head: cell.format(**r) for head, cell in COLUMNS.items()} for r in results]
    return section(
        "async-vs-sync",
        "bench/run_async_vs_sync.py",
        f"{measured_on()}, no GPU: {steps} steps of agents/math_multi_turn.yaml each (8 "
        "prompts x 4 runs a step, SmolLM2-135M, embedded engine, DeepSpeed ZeRO-0).",
        table(rows, "l" * len(COLUMNS)),
        f"Async over sync, training loop: {sync['loop_s'] / asyn['loop_s']:.2f}x "
        f"({sync['loop_s']:.0f} s -> {asyn['loop_s']:.0f} s).",
    )


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", default="runs/bench/async_vs_sync")
    args = p.parse_args(argv)
    out = ROOT / args.out
    results = [run("sync", 0, args.steps, out), run("async", 1, args.steps, out)]
    (out.parent / "async_vs_sync.json").write_text(json.dumps(results, indent=2))
    publish(args, doc_section(results, args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
