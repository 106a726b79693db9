"""Where benchmark figures go: a section of docs/benchmarks.md between two markers, with
the machine they were measured on."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, section: str, begin: str, end: str) -> None:
    """Replace the text between the markers (or append the section) and keep the rest."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    head, found, rest = text.partition(begin)
    if found and end in rest:
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    path.write_text(text)


def cpu_name() -> str:
    """The CPU's model name, as the figures' sections name the machine."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown CPU"
    names = (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return next(names, "unknown CPU")
