"""Rewards flowing backwards along each branch of a session's tree of turns.

A completion's return is its own reward plus `turn_discount` times its child's return
(the mean over children where the conversation branched). The result depends only on
the tree, never on the order the rows were inserted in.
"""

from __future__ import annotations

from typing import Any


def discounted_returns(completions: list[dict[str, Any]], turn_discount: float) -> dict[str, float]:
    by_id = {c["id"]: c for c in completions}
    children: dict[str, list[str]] = {cid: [] for cid in by_id}
    for c in completions:
        parent = c.get("parent_id")
        if parent in children:
            children[parent].append(c["id"])

    memo: dict[str, float] = {}

    def ret(cid: str) -> float:
        # iterative post-order to survive very deep sessions
        stack = [(cid, False)]
        while stack:
            node, expanded = stack.pop()
            if node in memo:
                continue
            kids = children[node]
            if not expanded and any(k not in memo for k in kids):
                stack.append((node, True))
                stack.extend((k, False) for k in kids if k not in memo)
                continue
            own = by_id[node].get("reward")
            own = 0.0 if own is None else float(own)
            future = sum(memo[k] for k in kids) / len(kids) if kids else 0.0
            memo[node] = own + turn_discount * future
        return memo[cid]

    return {cid: ret(cid) for cid in by_id}
