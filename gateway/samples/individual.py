"""`export_style: individual`: one sample per completion, its prompt masked out."""

from __future__ import annotations

from typing import Any

from gateway.samples.registry import register_export_style
from gateway.samples.returns import discounted_returns
from gateway.samples.sample import Sample, chain_sample, require_reward


@register_export_style("individual")
def individual_samples(
    session_id: str, completions: list[dict[str, Any]], turn_discount: float = 1.0
) -> list[Sample]:
    """One sample per completion: its prompt (masked) followed by its output."""
    require_reward(session_id, completions)
    returns = discounted_returns(completions, turn_discount)
    samples = (chain_sample(session_id, [c], [returns[c["id"]]]) for c in completions)
    return [s for s in samples if s is not None]
