"""Training run folders the gateway was told about (`--run-dir`, or the trainer's own),
and their metrics: one JSON row per step in metrics.jsonl, held-out evaluations in
eval.jsonl, both written by trainer/run_log.py while the run goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_dir(configured: list[str], index: int) -> Path | None:
    """The `index`th run folder (None: there is no such run)."""
    return Path(configured[index]) if 0 <= index < len(configured) else None


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


def run_metrics(run: Path) -> dict[str, Any]:
    return {
        "name": run.name,
        "path": str(run),
        "rows": _jsonl(run / "metrics.jsonl"),
        "evals": _jsonl(run / "eval.jsonl"),
    }
