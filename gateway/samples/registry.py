"""Export styles by name: how a recorded session becomes training samples.

A style is one function `(session_id, completions, turn_discount) -> list[Sample]`,
registered with `@register_export_style("name")`; `--style` on the CLI, `?style=` on
the REST export and `rollout.agent.export_style` in the trainer all choose from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.registry import Registry
from gateway.samples.sample import Sample, trainable

ExportStyle = Callable[[str, list[dict[str, Any]], float], list[Sample]]
EXPORT_STYLES: Registry[ExportStyle] = Registry("export_style")
register_export_style = EXPORT_STYLES.register
check_export_style = EXPORT_STYLES.lookup


def export_session(
    session_id: str,
    completions: list[dict[str, Any]],
    style: str = "individual",
    turn_discount: float = 1.0,
    include_side_requests: bool = False,
) -> list[Sample]:
    """The session's samples under `style`; aborted answers (and, unless asked for,
    side requests) are left out."""
    kept = trainable(completions, include_side_requests)
    return EXPORT_STYLES.lookup(style)(session_id, kept, turn_discount)
