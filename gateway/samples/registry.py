"""Export styles by name: how a recorded session becomes training samples.

A style is one function `(session_id, completions, turn_discount) -> list[Sample]`,
registered with `@register_export_style("name")`; `--style` on the CLI, `?style=` on
the REST export and `rollout.agent.export_style` in the trainer all choose from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.samples.sample import Sample, trainable

ExportStyle = Callable[[str, list[dict[str, Any]], float], list[Sample]]
EXPORT_STYLES: dict[str, ExportStyle] = {}


def register_export_style(name: str) -> Callable[[ExportStyle], ExportStyle]:
    def register(fn: ExportStyle) -> ExportStyle:
        EXPORT_STYLES[name] = fn
        return fn

    return register


def check_export_style(style: str) -> None:
    if style not in EXPORT_STYLES:
        raise ValueError(f"unknown export_style {style!r}; choose one of {sorted(EXPORT_STYLES)}")


def export_session(
    session_id: str,
    completions: list[dict[str, Any]],
    style: str = "individual",
    turn_discount: float = 1.0,
) -> list[Sample]:
    """The session's samples under `style`; aborted answers are left out."""
    check_export_style(style)
    return EXPORT_STYLES[style](session_id, trainable(completions), turn_discount)
