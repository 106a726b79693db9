"""The config reference, from its one source: each field's `setting(default, help)`.

`turnstile train --help-config` prints it as text, section by section with defaults;
docs/training.md holds it as tables between two markers, written by
`python -m trainer.config_doc --write` (tests/test_config_doc.py fails when they differ).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.api.config import TrainerConfig

DOC = Path(__file__).resolve().parent.parent / "docs" / "training.md"
BEGIN = (
    "<!-- config reference: written by `python -m trainer.config_doc --write` from the help "
    "of each field in trainer/api/config.py and gateway/config.py; edit it there -->"
)
END = "<!-- end of config reference -->"


@dataclass
class Section:
    key: str  # "" for the top level, else the dotted path: "rollout.agent"
    help: str
    fields: list[tuple[str, str, str]]  # (dotted key, default as YAML writes it, help)


def sections(cls: type = TrainerConfig, key: str = "", help: str = "") -> Iterator[Section]:
    """Every section of the config, depth first, each with its plain fields."""
    own, nested = [], []
    for f in dataclasses.fields(cls):
        path = f"{key}.{f.name}" if key else f.name
        if dataclasses.is_dataclass(f.default_factory):
            nested.append((f.default_factory, path, f.metadata["help"]))
        else:
            own.append((path, _default(f), f.metadata["help"]))
    yield Section(key, help or (cls.__doc__ or "").strip(), own)
    for sub, path, sub_help in nested:
        yield from sections(sub, path, sub_help)  # type: ignore[arg-type]


def _default(f: dataclasses.Field) -> str:
    if f.metadata.get("shown"):
        return f.metadata["shown"]  # computed at start-up (e.g. from the environment)
    value: Any = f.default
    if value is dataclasses.MISSING:
        value = f.default_factory()  # type: ignore[misc]
    if isinstance(value, tuple):
        value = list(value)
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value


def as_text() -> str:
    """For a terminal: `[section]  what it is`, then `key = default` and its help."""
    out = []
    for s in sections():
        out += textwrap.wrap(f"[{s.key or 'top level'}]  {s.help}", 90, subsequent_indent="  ")
        for key, default, help in s.fields:
            out.append(f"  {key} = {default}")
            out += textwrap.wrap(help, 88, initial_indent=" " * 6, subsequent_indent=" " * 6)
        out.append("")
    return "\n".join(out)


def as_markdown() -> str:
    """For docs/training.md: one table per section, the markers around it."""
    out = [BEGIN, ""]
    for s in sections():
        out += [f"**`{s.key}`**: {s.help}" if s.key else f"**Top level**: {s.help}", ""]
        out += ["| key | default | meaning |", "|---|---|---|"]
        for key, default, help in s.fields:
            out.append(f"| `{key}` | `{default}` | {_cell(help)} |")
        out.append("")
    return "\n".join([*out, END])


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def documented(doc: str) -> str:
    """The reference section as docs/training.md has it now (markers included)."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC} has no config reference between the markers")
    return doc[start : end + len(END)]


def main(argv: list[str] | None = None) -> int:
    """`--write`: update docs/training.md; otherwise print the markdown."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        doc = DOC.read_text()
        DOC.write_text(doc.replace(documented(doc), as_markdown()))
        return 0
    print(as_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
