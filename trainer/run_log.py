"""What a run leaves behind: metrics.jsonl (one line a step) and a reward-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class RunLog:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rows: list[dict[str, Any]] = []

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

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
            smooth = [
                sum(rewards[max(0, i - k + 1) : i + 1]) / len(rewards[max(0, i - k + 1) : i + 1])
                for i in range(len(rewards))
            ]
            ax.plot(steps, smooth, lw=2.2, label=f"{k}-step moving average")
        ax.set_xlabel("training step (policy version)")
        ax.set_ylabel("mean episode reward")
        ax.set_title(self.run_dir.name)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
