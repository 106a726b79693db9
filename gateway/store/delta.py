"""A turn stores only what is new: its request and prompt ids as a delta on its parent's.

A later turn of a conversation repeats its parent: the same tools and settings, the same
messages and a few more, and prompt ids that start with the parent's prompt + output
ids. Stored whole, a 64-turn session held ~32 copies of its conversation; stored as
deltas it holds about one. Reads rebuild each turn from its parent (`Rebuilder`).

A delta row's `request` column is `{"keys": [...], "extend": {...}, "set": {...}}`:
the request's keys in their order; lists that continue the parent's list (only the new
tail is kept); values that differ. A key in neither is the parent's value. Its
`prompt_ids` column holds the ids after the first `prompt_shared`, which are the first
ids of the parent's prompt + output. A rebuilt request is the same JSON as the one
stored whole would have been, to the byte: values count as equal only when their JSON
is (1, 1.0 and True are three different values here).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gateway import json_codec
from gateway.store.codec import pack_ints, unpack_ints

Request = dict[str, Any]


@dataclass(slots=True, frozen=True)
class Full:
    """A turn as it was asked: what a child's delta is taken against."""

    request: Request
    prompt_ids: list[int]
    output_ids: list[int]


def same(a: Any, b: Any) -> bool:
    """Equal as JSON: same types all the way down (1 == 1.0 == True is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(v, b[k]) for k, v in a.items())  # key order too
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float):
        return repr(a) == repr(b)  # -0.0, nan
    return bool(a == b)


def same_items(old: list[Any], new: list[Any]) -> bool:
    """`old` equals `new[:len(old)]` item by item, as `same` says.

    A turn's messages repeat its parent's, so this runs over the whole history every
    turn where they are not its parent's very objects, in C: equal JSON leaves only
    `null` open (orjson writes None, NaN and the infinities so), and Python's `==` tells
    those apart. `same` walks the items only where neither settles it (a NaN in both, a
    value orjson cannot write). (A search of the bytes for `null` took longer than both
    compares together.)"""
    if len(old) > len(new):
        return False
    if not old:
        return True
    head = new[: len(old)]
    try:
        as_json = json_codec.dumps(old) == json_codec.dumps(head)
    except TypeError:
        return all(map(same, old, head))
    if not as_json:
        return False
    return old == head or all(map(same, old, head))


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (slice compares run in C; halving finds the
    first difference in O(n log n) element compares, no Python loop over tokens)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def continued_length(prompt: list[int], output: list[int], ids: list[int]) -> int:
    """How many leading `ids` are a parent's `prompt` then `output` ids (without
    building their 30k-token concatenation for a long session's every turn)."""
    n = shared_prefix(prompt, ids)
    if n < len(prompt):
        return n
    return n + shared_prefix(output, ids[n:])


def request_delta(base: Request, request: Request) -> tuple[Request, bool]:
    """The delta of `request` on `base`, and whether any list of `base` was continued.

    A list that starts with `base`'s very objects continues it without a compare: a
    body parsed on its session's previous one holds that one's messages
    (gateway/entrypoints/incremental_body.py), and recorded requests are not changed;
    other lists are compared as JSON (`same_items`)."""
    extend: dict[str, list[Any]] = {}
    changed: dict[str, Any] = {}
    for key, value in request.items():
        old = base.get(key, _MISSING)
        if isinstance(value, list) and isinstance(old, list) and len(old) <= len(value):
            if all(map(operator.is_, old, value)) or same_items(old, value):
                if len(old) < len(value):
                    extend[key] = value[len(old) :]
                continue
        elif same(old, value):
            continue
        changed[key] = value
    return {"keys": list(request), "extend": extend, "set": changed}, bool(extend)


def apply_request_delta(base: Request, delta: Request) -> Request:
    """The request a delta row stood for (a new dict; the parent's lists are not changed)."""
    extend, changed = delta["extend"], delta["set"]
    out: Request = {}
    for key in delta["keys"]:
        if key in changed:
            out[key] = changed[key]
        elif key in extend:
            out[key] = base[key] + extend[key]
        else:
            out[key] = base[key]
    return out


def delta_columns(
    parent: Full | None,
    request: Request,
    prompt_ids: list[int],
    continues: bool | None = None,
) -> dict[str, Any]:
    """The `request`, `prompt_ids`, `is_delta` and `prompt_shared` columns of a row.

    Full when there is no parent, or when the turn continues nothing of it (neither a
    list of its request nor the start of its tokens): one way to decide, at write time
    and in the migration alike. `continues`: the prompt is known to start with the
    parent's prompt + output ids (it was built on them), so they need no comparing.
    """
    if parent is not None:
        delta, continued = request_delta(parent.request, request)
        if continues:
            shared = len(parent.prompt_ids) + len(parent.output_ids)
        else:
            shared = continued_length(parent.prompt_ids, parent.output_ids, prompt_ids)
        if continued or shared:
            return {
                "request": delta,
                "prompt_ids": pack_ints(prompt_ids[shared:]),
                "is_delta": True,
                "prompt_shared": shared,
            }
    return {"request": request, "prompt_ids": pack_ints(prompt_ids), "is_delta": False,
            "prompt_shared": 0}  # fmt: skip


class MissingParent(LookupError):
    """A delta row whose parent is not in the store: the store is damaged."""


class Rebuilder:
    """Rebuilds rows of one session from their stored deltas. `lookup(id)` gives a stored
    row's mapping, or None.

    `full` keeps every row it rebuilds, so reading a whole session walks its chain once
    (each turn costs its own size, not its depth). `one` rebuilds a single row (a parent
    to link, a `previous_response_id`) in place along its chain and keeps nothing, so
    its cost is the row's size plus the chain's deltas, not the sum of its ancestors.
    """

    def __init__(self, lookup: Callable[[str], Any]) -> None:
        self._lookup = lookup
        self._full: dict[str, Full] = {}

    def row(self, completion_id: str) -> Any:
        row = self._lookup(completion_id)
        if row is None:
            raise MissingParent(f"completion {completion_id} is not in the store")
        return row

    def _chain(self, row: Any, known: dict[str, Full]) -> list[Any]:
        """The row, then its delta ancestors up to a whole row or one in `known`."""
        pending = [row]
        while pending[-1]["is_delta"] and pending[-1]["parent_id"] not in known:
            parent = self._lookup(pending[-1]["parent_id"])
            if parent is None:
                raise MissingParent(
                    f"completion {pending[-1]['id']} is stored as a delta on "
                    f"{pending[-1]['parent_id']}, which is not in the store"
                )
            pending.append(parent)
        return pending

    def full(self, row: Any) -> Full:
        """The row's whole request and prompt ids (a mapping with the stored columns)."""
        done = self._full.get(row["id"])
        if done is not None:
            return done
        for r in reversed(self._chain(row, self._full)):
            request, prompt = r["request"], unpack_ints(r["prompt_ids"])
            if r["is_delta"]:  # the parent's prompt + output, cut to what is shared, + its own
                parent = self._full[r["parent_id"]]
                request = apply_request_delta(parent.request, request)
                prompt = [*parent.prompt_ids, *parent.output_ids][: r["prompt_shared"]] + prompt
            self._full[r["id"]] = Full(request, prompt, unpack_ints(r["output_ids"]))
        return self._full[row["id"]]

    def one(self, row: Any) -> Full:
        """One row whole, built in place along its chain (nothing of it is kept)."""
        chain = self._chain(row, {})[::-1]  # from a whole row down to this one
        request, prompt = chain[0]["request"], unpack_ints(chain[0]["prompt_ids"])
        output = unpack_ints(chain[0]["output_ids"])
        for r in chain[1:]:
            request = apply_request_delta(request, r["request"])
            prompt.extend(output)  # the parent's prompt + output, cut to what is shared
            del prompt[r["prompt_shared"] :]
            prompt.extend(unpack_ints(r["prompt_ids"]))
            output = unpack_ints(r["output_ids"])
        return Full(request, prompt, output)


def by_id(rows: Iterable[Any]) -> Callable[[str], Any]:
    return {r["id"]: r for r in rows}.get


_MISSING = object()
