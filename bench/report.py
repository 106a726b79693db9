"""What every benchmark's figures share: alternating rounds and their medians, markdown
tables, the machine's name, and a doc section between two markers that a run rewrites
(the prose around it stays ours)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def arguments(doc: str, rounds: int | None = None) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first line, `--no-docs`, and `--rounds`."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--no-docs", dest="write_docs", action="store_false", help="docs untouched")
    if rounds is not None:
        p.add_argument("--rounds", type=int, default=rounds, help="alternating rounds")
    return p


def section(name: str, writer: str, *blocks: str | list[str]) -> str:
    """The text of section `name`, between the markers its writer's runs look for: its
    blocks (a paragraph, or a table's lines), a blank line apart."""
    begin, end = f"<!-- BEGIN {name} (written by {writer}) -->", f"<!-- END {name} -->"
    return "\n\n".join([begin, *(b if isinstance(b, str) else "\n".join(b) for b in blocks), end])


def write_section(text: str, path: Path = DOC) -> None:
    """Replace the section between `text`'s first and last lines (its markers) in `path`,
    or append it, and keep the rest."""
    begin, end = text.splitlines()[0], text.splitlines()[-1]
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    head, found, rest = old.partition(begin)
    if found and end in rest:
        path.write_text(head + text + rest.split(end, 1)[1])
    else:
        path.write_text(old.rstrip("\n") + "\n\n" + text + "\n")


def publish(args: argparse.Namespace, *texts: str, path: Path = DOC) -> None:
    """Print each section, and write it into `path` unless the run has `--no-docs`."""
    for text in texts:
        print(text)
        if args.write_docs:
            write_section(text, path)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (metrics.jsonl, results.jsonl); none if it is absent."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(rows: Sequence[dict[str, object]], align: str) -> list[str]:
    """A markdown table of `rows`, each by column (the first row's keys head it); `align`
    has a letter per column, `l` or `r`."""

    def line(cells: Iterable[object]) -> str:
        return "| " + " | ".join(map(str, cells)) + " |"

    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align)
    return [line(rows[0]), rule, *(line(row.values()) for row in rows)]


def cpu_name() -> str:
    """The CPU's model name, as the figures' sections name the machine."""
    names = re.findall(r"^model name\s*: (.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    return names[0].strip() if names else "unknown CPU"


def measured_on() -> str:
    """ "Measured <day> on <n> cores (<cpu>)": how every section starts."""
    return f"Measured {dt.date.today()} on {os.cpu_count()} cores ({cpu_name()})"


def alternate(
    steps: dict[str, Callable[[], object]], rounds: int, warm_up: bool = True
) -> dict[str, list[float]]:
    """Seconds each step took, round by round. The order flips every round, so the
    machine's background load hits every step alike; a first round, untimed, warms up."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for r in range(rounds + warm_up):
        for name in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            steps[name]()
            if r or not warm_up:
                times[name].append(time.perf_counter() - t0)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(ts) for name, ts in times.items()}


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile, `q` in percent (NaN when empty)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5))) - 1]
