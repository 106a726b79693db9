"""What a run leaves behind: metrics.jsonl (one line a step), eval.jsonl (held-out
evaluations), the same scalars in each configured experiment tracker (TensorBoard by
default; trainer/trackers.py), and a reward-curve PNG. A resumed run keeps the rows of
the steps it already made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.trackers import Tracker


class RunLog:
    def __init__(
        self, run_dir: Path, *, start_step: int = 0, trackers: list[Tracker] | None = None
    ) -> None:
        """`start_step`: steps already made (resume); rows after it are dropped."""
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.eval_path = run_dir / "eval.jsonl"
        self.rows = _rewrite(self.metrics_path, start_step)
        self.evals = _rewrite(self.eval_path, start_step)
        self.trackers = list(trackers or [])

    def append(self, row: dict[str, Any]) -> None:
        scalars = {
            _tag(key): float(value)
            for key, value in row.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        self._append(self.rows, self.metrics_path, row, scalars)

    def append_eval(self, row: dict[str, Any]) -> None:
        """One held-out evaluation (trainer/evaluation.py EvalResult.to_dict())."""
        scalars = {f"eval/{key}": float(row[key]) for key in ("accuracy", "reward_mean")}
        self._append(self.evals, self.eval_path, row, scalars)

    def _append(
        self, rows: list[dict[str, Any]], path: Path, row: dict[str, Any], scalars: dict
    ) -> None:
        rows.append(row)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        for tracker in self.trackers:
            tracker.log(scalars, int(row["step"]))

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()

    def plot_rewards(self, path: Path | None = None) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = path or self.run_dir / "reward_curve.png"
        steps = [r["step"] for r in self.rows]
        rewards = [r.get("reward_mean") for r in self.rows]
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
        ax.plot(steps, rewards, marker="o", lw=1.2, label="mean reward per step")
        if len(rewards) >= 3:
            k = 3
            # a step whose every episode failed has no reward: averaged over the others
            smooth = [
                mean([r for r in rewards[max(0, i - k + 1) : i + 1] if r is not None])
                for i in range(len(rewards))
            ]
            ax.plot(steps, smooth, lw=2.2, label=f"{k}-step moving average")
        if self.evals:  # held-out, greedy: the figure that shows learning
            xs = [e["step"] for e in self.evals]
            acc = [e["accuracy"] for e in self.evals]
            err = [
                [a - e["accuracy_ci"][0] for a, e in zip(acc, self.evals, strict=True)],
                [e["accuracy_ci"][1] - a for a, e in zip(acc, self.evals, strict=True)],
            ]
            ax.errorbar(
                xs, acc, yerr=err, fmt="s", color="black", capsize=4, ms=6,
                label="held-out accuracy (greedy, 95% CI)",
            )  # fmt: skip
        ax.set_xlabel("training step (policy version)")
        ax.set_ylabel("reward / accuracy")
        ax.set_title(self.run_dir.name)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path


def _rewrite(path: Path, start_step: int) -> list[dict[str, Any]]:
    """The rows of `path` up to `start_step` (none on a fresh run), the file cut to them."""
    rows = []
    if start_step and path.exists():
        rows = [
            r for r in map(json.loads, path.read_text().splitlines()) if r["step"] <= start_step
        ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _tag(key: str) -> str:
    """Group TensorBoard charts: rewards, rollout, train, timing."""
    if key.startswith("reward"):
        return f"reward/{key}"
    if key.endswith("_s"):
        return f"time/{key}"
    if key in (
        "episodes",
        "episode_errors",
        "episode_retries",
        "episodes_without_reward",
        "completions",
    ) or (key.startswith(("turns", "staleness", "stale", "concat"))):
        return f"rollout/{key}"
    return f"train/{key}"


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
