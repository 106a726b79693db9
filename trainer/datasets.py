"""Datasets: rows handed unchanged to the agent's `run(data, ...)`.

Every row is a dict, usually ``{"messages": [...], "answer": "<string>"}``: the OpenAI
chat prompt the agent sends first and the reference its reward checks against. Two
sources, chosen by the trainer config's `dataset:`:

- ``{type: jsonl, path: data.jsonl, size: 100}``: a JSONL file of ``{"messages",
  "answer"}`` or ``{"question", "answer"}`` rows (`size`, optional, keeps the first);
- ``{type: python, function: "path/file.py:fn" or "module.fn", **args}``: the rows a
  function of yours returns, e.g. the example task's
  ``agents/math_task.py:arithmetic_word_problems``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.loading import load_object

__all__ = ["load_dataset", "load_jsonl"]


def _row_from_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "answer" not in record:
        raise ValueError(f"{where}: missing key 'answer'")
    answer = record["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise ValueError(f"{where}: 'answer' must be a string or a number")
    if "messages" in record:
        messages = record["messages"]
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages)
        ):
            raise ValueError(
                f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects"
            )
    elif "question" in record:
        if not isinstance(record["question"], str):
            raise ValueError(f"{where}: 'question' must be a string")
        messages = [{"role": "user", "content": record["question"]}]
    else:
        raise ValueError(f"{where}: missing key 'messages' (or 'question')")
    row = {k: v for k, v in record.items() if k != "question"}
    row["messages"] = messages
    row["answer"] = str(answer)
    return row


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read rows from a JSONL file; blank lines are skipped.

    Each line is ``{"messages": [...], "answer": ...}`` or ``{"question": "...", "answer":
    ...}`` (the question becomes a single user message). Answers are turned into strings;
    other keys are kept. A bad line raises ``ValueError`` naming the file and line number.
    """
    path = Path(path)
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
            rows.append(_row_from_record(record, where))
    return rows


def load_dataset(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Build a dataset from a config dict (see the module docstring)."""
    if not isinstance(spec, dict):
        raise ValueError(f"dataset spec must be a mapping, got {type(spec).__name__}")
    spec = dict(spec)
    kind = spec.pop("type", None)
    if kind == "python":
        if "function" not in spec:
            raise ValueError("a 'python' dataset needs a 'function' (path/file.py:fn or module.fn)")
        fn = load_object(spec.pop("function"), "dataset function")
        try:
            rows = fn(**spec)
        except TypeError as e:
            raise ValueError(f"bad option for the dataset function: {e}") from None
        return list(rows)
    if kind == "jsonl":
        if "path" not in spec:
            raise ValueError("a 'jsonl' dataset needs a 'path'")
        path = spec.pop("path")
        size = spec.pop("size", None)
        if spec:
            raise ValueError(f"unknown option(s) for the jsonl dataset: {sorted(spec)}")
        rows = load_jsonl(path)
        return rows if size is None else rows[: int(size)]
    raise ValueError(f"unknown dataset type {kind!r}; expected 'jsonl' or 'python'")
