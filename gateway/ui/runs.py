"""Training run folders the gateway was told about (`--run-dir`, or the trainer's own),
and their metrics: one JSON row per step in metrics.jsonl, held-out evaluations in
eval.jsonl, both written by trainer/run_log.py while the run goes on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(slots=True, frozen=True)
class RunDir:
    index: int
    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        return (self.path / "metrics.jsonl").is_file()


def run_dirs(configured: list[str]) -> list[RunDir]:
    return [RunDir(i, Path(p)) for i, p in enumerate(configured)]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a file another process is appending to: a half-written last line is
    left for the next read."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def run_metrics(run: RunDir) -> dict[str, Any]:
    return {
        "name": run.name,
        "path": str(run.path),
        "rows": _jsonl(run.path / "metrics.jsonl"),
        "evals": _jsonl(run.path / "eval.jsonl"),
    }
