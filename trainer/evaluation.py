"""Held-out evaluation: is the policy better than it was, beyond the noise?

Training rewards are noisy (every step draws new prompts of uneven difficulty), so
learning is shown on a fixed held-out set instead: the same agent, unchanged, run once
per held-out row through the same gateway, in sessions that force greedy sampling.
Each result carries 95% intervals: a normal interval for the mean reward and a Wilson
interval for accuracy (the share of episodes reaching `success_reward`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from trainer.api.config import EvalConfig
from trainer.datasets import load_dataset

Z95 = 1.959964


@dataclass
class EvalResult:
    step: int  # training steps made before this evaluation (0: the base model)
    policy_version: int
    n: int
    reward_mean: float
    reward_ci: tuple[float, float]
    accuracy: float
    accuracy_ci: tuple[float, float]
    errors: int  # episodes that crashed or gave no reward (counted as 0)
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        lo, hi = self.accuracy_ci
        rlo, rhi = self.reward_ci
        return (
            f"accuracy {self.accuracy:.3f} [{lo:.3f}, {hi:.3f}]  "
            f"mean reward {self.reward_mean:.3f} [{rlo:.3f}, {rhi:.3f}]  "
            f"(n={self.n}, greedy, {self.seconds:.0f} s"
            + (f"; {self.errors} failed, counted as wrong)" if self.errors else ")")
        )


def mean_interval(values: list[float]) -> tuple[float, float]:
    """95% normal interval of the mean."""
    n = len(values)
    if n < 2:
        m = values[0] if values else 0.0
        return (m, m)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return (m - half, m + half)


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (sound at 0 and n successes too)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denom
    # it always holds p; say so exactly (at p = 1 the float sum falls short by 1e-16)
    return (min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)))


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row.get("messages") or row, sort_keys=True, default=str)


def held_out_rows(cfg: EvalConfig, train_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`cfg.size` rows of the eval dataset (set), none of which is a training prompt."""
    seen = {_key(r) for r in train_rows}
    rows = [r for r in load_dataset(cfg.dataset) if _key(r) not in seen]
    if len(rows) < cfg.size:
        raise ValueError(
            f"eval.dataset has only {len(rows)} rows that are not training prompts; "
            f"eval.size asks for {cfg.size}"
        )
    return rows[: cfg.size]


def summarise(
    rewards: list[float | None], cfg: EvalConfig, step: int, version: int, seconds: float
) -> EvalResult:
    values = [0.0 if r is None else float(r) for r in rewards]
    wins = sum(1 for v in values if v >= cfg.success_reward)
    n = len(values)
    return EvalResult(
        step=step,
        policy_version=version,
        n=n,
        reward_mean=sum(values) / n if n else 0.0,
        reward_ci=mean_interval(values),
        accuracy=wins / n if n else 0.0,
        accuracy_ci=wilson_interval(wins, n),
        errors=sum(1 for r in rewards if r is None),
        seconds=seconds,
    )


class Evaluator:
    """When to evaluate during a run, on which rows, and with which (greedy) runner."""

    def __init__(self, cfg: EvalConfig, rows: list[dict[str, Any]], runner: Any) -> None:
        self.cfg = cfg
        self.rows = rows
        self.runner = runner
        self.results: list[EvalResult] = []

    def due(self, steps_done: int) -> bool:
        """After `steps_done` steps (0: before the first), is an evaluation due?"""
        if steps_done == 0:
            return self.cfg.before
        return bool(self.cfg.every) and steps_done % self.cfg.every == 0

    @property
    def last_seconds(self) -> float:
        return self.results[-1].seconds if self.results else 0.0

    async def run(self, steps_done: int, version: int) -> EvalResult | None:
        """The agent once per row (the runner makes greedy, eval-tagged sessions) with
        these weights; None when they were just evaluated."""
        if self.results and self.results[-1].policy_version == version:
            return None
        started = time.perf_counter()
        episodes = await asyncio.gather(
            *(self.runner.run_episode(row, -1 - i) for i, row in enumerate(self.rows))
        )
        rewards = [None if ep.error or ep.reward is None else ep.reward for ep in episodes]
        seconds = time.perf_counter() - started
        result = summarise(rewards, self.cfg, steps_done, version, seconds)
        self.results.append(result)
        return result
