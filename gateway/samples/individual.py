"""`export_style: individual`: one sample per completion, its prompt masked out."""

from __future__ import annotations

from typing import Any

from gateway.samples.registry import register_export_style
from gateway.samples.returns import discounted_returns
from gateway.samples.sample import Sample, require_reward, reward_of, sampling_temperature


@register_export_style("individual")
def individual_samples(
    session_id: str, completions: list[dict[str, Any]], turn_discount: float = 1.0
) -> list[Sample]:
    """One sample per completion: its prompt (masked) followed by its output."""
    require_reward(session_id, completions)
    returns = discounted_returns(completions, turn_discount)
    samples = []
    for c in completions:
        prompt, output = c["prompt_ids"], c["output_ids"]
        if not output:
            continue
        samples.append(
            Sample(
                session_id=session_id,
                completion_ids=[c["id"]],
                input_ids=list(prompt) + list(output),
                loss_mask=[0] * len(prompt) + [1] * len(output),
                logprobs=[0.0] * len(prompt) + list(c["output_logprobs"]),
                versions=[-1] * len(prompt) + list(c["output_versions"]),
                reward=reward_of(c),
                returns=returns[c["id"]],
                temperature=sampling_temperature(c),
                meta={"finish_reason": c.get("finish_reason"), "parent_id": c.get("parent_id")},
            )
        )
    return samples
