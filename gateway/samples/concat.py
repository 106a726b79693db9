"""`export_style: concat`: a multi-turn conversation as one training sequence.

Training each turn on its own (`individual`) pays for every earlier turn's tokens again
as prompt; here each leaf of the tree of *joined* turns (a prompt continuing its
parent's tokens exactly, at the same temperature) is one sample. docs/training.md
("From sessions to a gradient step", 2. Samples) states the rules: joins, fallbacks,
returns, and what is dropped.
"""

from __future__ import annotations

from typing import Any

from gateway.samples.registry import register_export_style
from gateway.samples.sample import (
    Sample,
    chain_sample,
    require_reward,
    reward_of,
    sampling_temperature,
)

Completion = dict[str, Any]


def joins(parent: Completion, child: Completion) -> bool:
    """Can `child` extend the sequence that ends with `parent`?

    The accumulated tokens of a chain that ends with `parent` are always
    parent.prompt_ids + parent.output_ids (every joined turn's prompt starts with the
    chain so far), so checking the parent alone checks the whole chain.
    """
    acc = list(parent["prompt_ids"]) + list(parent["output_ids"])
    prompt = child["prompt_ids"]
    return (
        len(prompt) >= len(acc)
        and list(prompt[: len(acc)]) == acc
        and sampling_temperature(parent) == sampling_temperature(child)
    )


def concat_chains(completions: list[Completion]) -> list[list[Completion]]:
    """The chains of joined turns, one per leaf, ordered by the leaf's (created_at, id)."""
    by_id = {c["id"]: c for c in completions}
    joined_parent: dict[str, str] = {}
    continued: set[str] = set()
    for c in completions:
        parent = by_id.get(c.get("parent_id"))
        if parent is not None and parent is not c and joins(parent, c):
            joined_parent[c["id"]] = parent["id"]
            continued.add(parent["id"])
    leaves = sorted(
        (c for c in completions if c["id"] not in continued),
        key=lambda c: (c.get("created_at") or 0.0, c["id"]),
    )
    chains = []
    for leaf in leaves:
        chain, seen = [leaf], {leaf["id"]}
        while (pid := joined_parent.get(chain[-1]["id"])) is not None and pid not in seen:
            seen.add(pid)
            chain.append(by_id[pid])
        chains.append(chain[::-1])
    return chains


def path_returns(chain: list[Completion], turn_discount: float) -> list[float]:
    """Per turn: r_k + gamma * r_{k+1} + ... along this chain only (None counts 0)."""
    out = [0.0] * len(chain)
    future = 0.0
    for k in range(len(chain) - 1, -1, -1):
        future = out[k] = reward_of(chain[k]) + turn_discount * future
    return out


@register_export_style("concat")
def concat_samples(
    session_id: str, completions: list[Completion], turn_discount: float = 1.0
) -> list[Sample]:
    """One sample per leaf of the joined conversation tree (see the module docstring)."""
    require_reward(session_id, completions)
    samples = []
    for chain in concat_chains(completions):
        # a chain that starts below a parent was cut off from it: a fallback
        meta = {"concat_fallbacks": int(chain[0].get("parent_id") is not None), "turns": len(chain)}
        returns = path_returns(chain, turn_discount)
        samples.append(chain_sample(session_id, chain, returns, meta, per_token=True))
    return [s for s in samples if s is not None]
