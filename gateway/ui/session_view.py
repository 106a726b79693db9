"""A recorded session as the session page shows it: the tree of turns, each turn's
tokens with what the chosen export style trains on, logprobs, returns and drift.

Everything comes from the code the trainer uses: the loss mask and returns are read
off `export_session`'s samples (not recomputed here), so the page shows what training
on this session under this style and `turn_discount` would really do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from typing import Any

from gateway.samples import NoRewardError, Sample, export_session, trainable
from gateway.ui.tokens import TokenTexts, logprob_band


@dataclass(slots=True)
class Turn:
    id: str
    parent_id: str | None
    depth: int
    children: list[str]
    record: dict[str, Any]
    shown_from: int  # prompt tokens before this index repeat the parent's; not spelled out
    prompt_html: str  # its tokens from `shown_from` on, as `<span>`s (see `_spans`)
    output_html: str
    in_export: bool
    reward: float | None
    ret: float | None
    drift: dict[str, Any] | None
    drift_was: str | None  # the parent's token at the drift point (None: the prompt is shorter)
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    reasoning: str | None = None
    content: str | None = None


@dataclass(slots=True)
class SessionView:
    turns: list[Turn]
    style: str
    turn_discount: float
    unrewarded: bool  # no reward yet: the split shows what would be trained once rewarded
    samples: int


def _cover(samples: list[Sample], records: dict[str, dict[str, Any]]) -> dict[str, tuple]:
    """completion id -> (sample, its return): the sample whose tokens start with that
    turn's prompt + output (for `concat`, the chain it was trained in)."""
    found: dict[str, tuple] = {}
    for s in samples:
        for cid in s.completion_ids:
            c = records.get(cid)
            if c is None or cid in found:
                continue
            n = len(c["prompt_ids"]) + len(c["output_ids"])
            if s.input_ids[:n] != list(c["prompt_ids"]) + list(c["output_ids"]):
                continue
            ret = s.returns
            if s.token_returns is not None and c["output_ids"]:
                ret = s.token_returns[len(c["prompt_ids"])]
            found[cid] = (s, ret)
    return found


def _samples(session_id: str, completions: list[dict[str, Any]], style: str, gamma: float):
    try:
        return export_session(session_id, completions, style, gamma), False
    except NoRewardError:
        zeroed = [{**c, "reward": 0.0} for c in completions]
        return export_session(session_id, zeroed, style, gamma), True


def _order(completions: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int, list[str]]]:
    """Depth-first over the tree of turns (children by time): each turn with its depth
    and its children's ids."""
    ids = {c["id"] for c in completions}
    kids: dict[str | None, list[dict[str, Any]]] = {}
    for c in completions:
        parent = c["parent_id"] if c["parent_id"] in ids else None
        kids.setdefault(parent, []).append(c)
    out: list[tuple[dict[str, Any], int, list[str]]] = []
    stack = [(c, 0) for c in reversed(kids.get(None, []))]
    while stack:
        c, depth = stack.pop()
        children = kids.get(c["id"], [])
        out.append((c, depth, [k["id"] for k in children]))
        stack.extend((k, depth + 1) for k in reversed(children))
    return out


def _said(record: dict[str, Any]) -> tuple[list[dict[str, str]], str | None, str | None]:
    """Tool calls, reasoning and text of the answer, from whichever endpoint's shape it
    was recorded in: chat (`message`), completions (`text`), responses (`output` items),
    Anthropic messages (`message.content` blocks)."""
    resp = record.get("response") or {}
    calls: list[dict[str, str]] = []
    reasoning: list[str] = []
    text: list[str] = []
    msg = resp.get("message") or {}
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        calls.append({"name": fn.get("name", ""), "arguments": fn.get("arguments", "")})
    if msg.get("reasoning_content"):
        reasoning.append(msg["reasoning_content"])
    if isinstance(msg.get("content"), str):
        text.append(msg["content"])
    if isinstance(resp.get("text"), str):
        text.append(resp["text"])
    for item in resp.get("output") or []:
        kind = item.get("type")
        if kind == "function_call":
            calls.append({"name": item.get("name", ""), "arguments": item.get("arguments", "")})
        elif kind == "reasoning":
            parts = (item.get("content") or []) + (item.get("summary") or [])
            reasoning += [p.get("text", "") for p in parts]
        elif kind == "message":
            text += [p.get("text", "") for p in item.get("content") or []]
    # Anthropic Messages: the recorded `message` is Anthropic's, its content a block list
    blocks = msg.get("content") if isinstance(msg.get("content"), list) else []
    for block in blocks:
        if block.get("type") == "tool_use":
            args = json.dumps(block.get("input"))
            calls.append({"name": block.get("name", ""), "arguments": args})
        elif block.get("type") == "thinking":
            reasoning.append(block.get("thinking", ""))
        elif block.get("type") == "text":
            text.append(block.get("text", ""))
    return calls, "\n".join(reasoning) or None, "".join(text) or None


def build_session_view(
    session_id: str,
    completions: list[dict[str, Any]],
    texts: TokenTexts,
    style: str,
    turn_discount: float,
) -> SessionView:
    samples, unrewarded = _samples(session_id, completions, style, turn_discount)
    by_id = {c["id"]: c for c in completions}
    cover = _cover(samples, {c["id"]: c for c in trainable(completions)})
    turns = [
        _turn(c, depth, children, by_id.get(c["parent_id"]), cover, texts)
        for c, depth, children in _order(completions)
    ]
    return SessionView(turns, style, turn_discount, unrewarded, len(samples))


def _turn(
    c: dict[str, Any],
    depth: int,
    children: list[str],
    parent: dict[str, Any] | None,
    cover: dict[str, tuple],
    texts: TokenTexts,
) -> Turn:
    prompt, output = list(c["prompt_ids"]), list(c["output_ids"])
    ids = prompt + output
    drift = (c.get("diagnostics") or {}).get("drift")
    shown_from, drift_was = 0, None
    if parent is not None:
        before = list(parent["prompt_ids"]) + list(parent["output_ids"])
        if drift and drift.get("at") is not None:
            shown_from = int(drift["at"])
            if shown_from < len(before):
                drift_was = texts.texts([before[shown_from]])[0]
        elif prompt[: len(before)] == before:
            shown_from = len(before)
    sample, ret = cover.get(c["id"], (None, None))
    n, start, cut = len(ids), shown_from, len(prompt)
    # only from `shown_from` on: what is before it is the parent's, shown on its card
    mask = sample.loss_mask[start:n] if sample else [0] * (n - start)
    lps: list[float | None] = list(sample.logprobs[start:n]) if sample else [None] * (n - start)
    vers: list[int | None] = list(sample.versions[start:n]) if sample else [None] * (n - start)
    # output tokens always carry their own recorded logprob and version
    for k, (lp, v) in enumerate(zip(c["output_logprobs"], c["output_versions"], strict=False)):
        if cut + k >= start:
            lps[cut + k - start], vers[cut + k - start] = lp, v
    words = texts.texts(ids[start:])
    at = drift.get("at") if drift else None
    # `<span>`s written here rather than by a Jinja macro: a long session has tens of
    # thousands of them, and a macro call each is ~20x slower. docs/viewer.md explains
    # the classes.
    spans: tuple[list[str], list[str]] = ([], [])  # the prompt's, the output's
    for k in range(start, n):
        j = k - start
        lp = lps[j] if (k >= cut or mask[j]) else None  # a masked prompt token shows none
        cls = f"tok {'trained' if mask[j] else 'masked'} b{logprob_band(lp)}"
        cls += " drift" * (k == at) + " partial" * (not words[j])
        attrs = f' data-i="{k}" data-id="{ids[k]}"'
        if lp is not None:
            attrs += f' data-lp="{lp:.4f}"'
            if vers[j] not in (None, -1):
                attrs += f' data-v="{vers[j]}"'
        spans[k >= cut].append(f'<span class="{cls}"{attrs}>{escape(words[j], quote=False)}</span>')
    calls, reasoning, content = _said(c)
    return Turn(
        id=c["id"],
        parent_id=c["parent_id"],
        depth=depth,
        children=children,
        record=c,
        shown_from=shown_from,
        prompt_html="".join(spans[0]),
        output_html="".join(spans[1]),
        in_export=sample is not None,
        reward=c.get("reward"),
        ret=ret,
        drift=drift,
        drift_was=drift_was,
        tool_calls=calls,
        reasoning=reasoning,
        content=content,
    )
