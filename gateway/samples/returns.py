"""Rewards flowing backwards along each branch of a session's tree of turns.

A completion's return is its own reward plus `turn_discount` times its child's return
(the mean over children where the conversation branched). The result depends only on
the tree, never on the order the rows were inserted in.
"""

from __future__ import annotations

from graphlib import TopologicalSorter
from typing import Any

from gateway.samples.sample import reward_of


def discounted_returns(completions: list[dict[str, Any]], turn_discount: float) -> dict[str, float]:
    children: dict[str, list[str]] = {c["id"]: [] for c in completions}
    for c in completions:
        if c.get("parent_id") in children:
            children[c["parent_id"]].append(c["id"])
    rewards = {c["id"]: reward_of(c) for c in completions}
    memo: dict[str, float] = {}
    # children before their parent, without recursion (sessions can be very deep)
    for cid in TopologicalSorter(children).static_order():
        kids = children[cid]
        future = sum(memo[k] for k in kids) / len(kids) if kids else 0.0
        memo[cid] = rewards[cid] + turn_discount * future
    return {cid: memo[cid] for cid in children}
