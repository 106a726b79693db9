"""Datasets for the example agents.

Every row is a dict ``{"messages": [...], "answer": "<string>"}``: ``messages`` is the
OpenAI chat prompt the agent sends first, ``answer`` the reference the reward checks
against. Rows are handed unchanged to the workflow's ``run(data, ...)``.

Sources:
- ``arithmetic_word_problems``: short seeded word problems generated in-process (no
  download), sized so that SmolLM2-135M-Instruct solves some but not most of them;
- ``load_jsonl``: a JSONL file of ``{"messages", "answer"}`` or ``{"question", "answer"}``;
- ``load_dataset``: either of the above from a config dict (the trainer's YAML).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_INSTRUCTION",
    "DEFAULT_SYSTEM_PROMPT",
    "OPERATIONS",
    "arithmetic_word_problems",
    "load_dataset",
    "load_jsonl",
]

DEFAULT_INSTRUCTION = "Give the final answer as a number at the end."
# A worked example in the system prompt raised SmolLM2-135M's first-turn accuracy on these
# problems from 6% to 12% at temperature 1.0 and from 20% to 30% at 0.7 (96 rows each), and
# shortened its answers. Pass system_prompt=None to drop it.
DEFAULT_SYSTEM_PROMPT = (
    "You solve short math word problems. Write the calculation, then the answer. "
    "Example: Tom has 2 apples and gets 3 more. 2 + 3 = 5. The answer is 5."
)

_NAMES = ["Sam", "Mia", "Tom", "Lily", "Ben", "Anna", "Max", "Zoe", "Leo", "Emma", "Jack", "Nora"]
_ITEMS = ["apples", "coins", "books", "pencils", "marbles", "stickers", "cookies", "toys"]
_CONTAINERS = ["boxes", "bags", "baskets", "rows", "jars"]

# Each template: (text with {name} {item} {a} {b} [{container}], how to compute the answer).
_TEMPLATES: dict[str, list[str]] = {
    "add": [
        "{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?",
        "{name} had {a} {item} and found {b} more. How many {item} does {name} have in total?",
        "There are {a} {item} on a table and {b} {item} on a shelf. How many {item} are there altogether?",
    ],
    "sub": [
        "{name} has {a} {item}. {name} gives away {b} {item}. How many {item} does {name} have left?",
        "{name} had {a} {item} and lost {b} of them. How many {item} are left?",
        "There are {a} {item} in a bag. {name} takes out {b}. How many {item} are still in the bag?",
    ],
    "mul": [
        "{name} has {a} {container} with {b} {item} in each. How many {item} does {name} have?",
        "There are {a} {container} and each has {b} {item}. How many {item} are there in total?",
    ],
}
OPERATIONS: tuple[str, ...] = tuple(_TEMPLATES)


def _operands(rng: random.Random, op: str, max_operand: int) -> tuple[int, int, int]:
    if op == "add":
        a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
        return a, b, a + b
    if op == "sub":
        a = rng.randint(2, max_operand)
        b = rng.randint(1, a - 1)
        return a, b, a - b
    if op == "mul":
        # Products of two operands up to max_operand get large fast; keep them small.
        top = max(2, min(10, max_operand // 2))
        a, b = rng.randint(2, top), rng.randint(2, top)
        return a, b, a * b
    raise ValueError(f"unknown operation {op!r}; expected one of {list(OPERATIONS)}")


def arithmetic_word_problems(
    n: int,
    seed: int = 0,
    max_operand: int = 20,
    operations: Sequence[str] = OPERATIONS,
    instruction: str | None = DEFAULT_INSTRUCTION,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> list[dict[str, Any]]:
    """Generate ``n`` one-step arithmetic word problems, deterministically from ``seed``.

    ``operations`` picks among ``"add"``, ``"sub"`` (result always >= 1) and ``"mul"``
    (factors in 2..min(10, max_operand // 2)). ``instruction`` is appended to the question;
    ``system_prompt`` (a worked example by default; ``None`` for none) is prepended as a
    system message.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if max_operand < 2:
        raise ValueError(f"max_operand must be >= 2, got {max_operand}")
    if isinstance(operations, str):
        operations = [operations]
    ops = list(operations)
    if not ops:
        raise ValueError("operations must not be empty")
    for op in ops:
        if op not in _TEMPLATES:
            raise ValueError(f"unknown operation {op!r}; expected one of {list(OPERATIONS)}")

    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for _ in range(n):
        op = rng.choice(ops)
        template = rng.choice(_TEMPLATES[op])
        a, b, result = _operands(rng, op, max_operand)
        question = template.format(
            name=rng.choice(_NAMES),
            item=rng.choice(_ITEMS),
            container=rng.choice(_CONTAINERS),
            a=a,
            b=b,
        )
        content = f"{question} {instruction}" if instruction else question
        messages = [{"role": "user", "content": content}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        rows.append({"messages": messages, "answer": str(result)})
    return rows


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
    """Build a dataset from a config dict.

    - ``{"type": "arithmetic", "size": 256, "seed": 0, ...}``: any other key is passed on to
      ``arithmetic_word_problems`` (``max_operand``, ``operations``, ``instruction``,
      ``system_prompt``);
    - ``{"type": "jsonl", "path": "data.jsonl", "size": 100}``: ``size`` (optional) keeps
      the first rows only.
    """
    if not isinstance(spec, dict):
        raise ValueError(f"dataset spec must be a mapping, got {type(spec).__name__}")
    spec = dict(spec)
    kind = spec.pop("type", None)
    if kind == "arithmetic":
        size = spec.pop("size", spec.pop("n", 256))
        try:
            return arithmetic_word_problems(int(size), **spec)
        except TypeError as e:
            raise ValueError(f"bad option for the arithmetic dataset: {e}") from None
    if kind == "jsonl":
        if "path" not in spec:
            raise ValueError("a 'jsonl' dataset needs a 'path'")
        path = spec.pop("path")
        size = spec.pop("size", None)
        if spec:
            raise ValueError(f"unknown option(s) for the jsonl dataset: {sorted(spec)}")
        rows = load_jsonl(path)
        return rows if size is None else rows[: int(size)]
    raise ValueError(f"unknown dataset type {kind!r}; expected 'arithmetic' or 'jsonl'")
