"""A request body that extends its session's previous one is parsed and hashed only where
it is new: an agent resends its whole history each turn (~150 kB at turn 64, ~3 kB new).
The result is provably the whole body's parse, its earlier messages the previous
request's very objects (frozen), and the same SHA-256; anything else is parsed whole.
The method and its proofs: docs/benchmarks.md ("The body parsed only where it is new").
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from gateway.frozen import FrozenList, freeze
from gateway.lru import LRU
from gateway.serving.turn import body_digest, body_hasher, request_hash

_COMMA, _CLOSE = 0x2C, 0x5D  # , ]


@dataclass(slots=True)
class _Prior:
    """A body of the session, and what is known of where its history lies."""

    body: bytes
    items: FrozenList  # the history as the request holds it
    start: int = -1  # its `[` (-1: not yet proven; -2: cannot be)
    end: int = -1  # its `]`
    state: Any = None  # SHA-256 of body[:end]


class IncrementalBodies:
    """Each session's recent bodies (LRU by session, bounded in count and bytes)."""

    def __init__(
        self, max_sessions: int, max_bytes: int, per_session: int = 4, min_bytes: int = 16384
    ) -> None:
        # by (session, request model): a body is built on one its own endpoint validated
        self._priors: LRU[tuple[str, type], list[_Prior]] = LRU(
            max_sessions,
            max_weight=max_bytes,
            weigh=lambda ps: sum(len(p.body) for p in ps),
            group=operator.itemgetter(0),
        )
        self.per_session = per_session
        # smaller bodies are parsed whole: that costs ~1 us a kB, less than the compares,
        # the proof and the bookkeeping below (a session's first turns, short sessions)
        self.min_bytes = min_bytes
        self.reused = 0  # bodies parsed only where new
        self.whole = 0  # bodies of `min_bytes` or more parsed whole

    def parse(
        self, model: type[BaseModel], raw: bytes, session_id: str, history: str | None
    ) -> tuple[Any, str]:
        """(the validated request, `request_hash(raw)`); raises what `model_validate_json`
        raises for a bad body."""
        if history is None:
            return model.model_validate_json(raw), request_hash(raw)
        if len(raw) < self.min_bytes:
            request = model.model_validate_json(raw)
            freeze_history(request, history)
            return request, request_hash(raw)
        key = (session_id, model)
        priors = self._priors.get(key) or []
        for i, prior in enumerate(priors):
            done = self._extend(prior, raw, model, history)
            if done is not None:
                request, digest, child = done
                self.reused += 1
                # the child stands for its parent from now on: a body is sent once
                self._keep(key, [child, *priors[:i], *priors[i + 1 :]])
                return request, digest
        request = model.model_validate_json(raw)
        self.whole += 1
        items = freeze_history(request, history)
        if isinstance(items, list) and items:
            self._keep(key, [_Prior(raw, items), *priors])
        return request, request_hash(raw)

    def forget(self, session_id: str) -> None:
        """An ended session sends no more bodies: its own need not be kept."""
        self._priors.drop_group(session_id)

    def _keep(self, key: tuple[str, type], priors: list[_Prior]) -> None:
        self._priors.put(key, priors[: self.per_session])

    def _extend(
        self, prior: _Prior, raw: bytes, model: type[BaseModel], history: str
    ) -> tuple[Any, str, _Prior] | None:
        """The request `raw` stands for, when it is `prior` with history appended."""
        old = prior.body
        if prior.start == -1:  # not proven yet: find the candidate end, then prove it
            end = common_prefix(old, raw)
            # (the bytes checked before the proof, which parses the whole old body)
            if end >= len(old) or old[end] != _CLOSE or not inserted_at(old, raw, end):
                return None
            start = history_start(old, history, end)
            if start < 0 or not proves_history(old, start, end, history, len(prior.items)):
                prior.start = -2  # never: not worth proving again
                return None
            prior.start, prior.end = start, end
            prior.state = body_hasher(memoryview(old)[:end])
        elif prior.start < 0 or not inserted_at(old, raw, prior.end):
            return None
        start, end = prior.start, prior.end
        new_end = len(raw) - (len(old) - end)  # where the grown history closes
        added = memoryview(raw)[end + 1 : new_end]
        try:  # whole values only: `[X]` must be an array
            values = orjson.loads(b"".join((b"[", added, b"]")))
            request = model.model_validate_json(
                b"".join((memoryview(old)[: start + 1], added, memoryview(old)[end:]))
            )
        except (orjson.JSONDecodeError, ValidationError):
            return None  # parsed whole, which reports what is wrong
        new = getattr(request, history)
        if not isinstance(new, list) or not new or len(new) != len(values):
            return None
        items = FrozenList.concat(prior.items, freeze(new))
        setattr(request, history, items)
        h = prior.state.copy()
        h.update(memoryview(raw)[end:new_end])
        state = h.copy()
        h.update(memoryview(raw)[new_end:])
        return request, body_digest(h), _Prior(raw, items, start, new_end, state)


def freeze_history(request: BaseModel, history: str) -> Any:
    """Freeze the request's history (a list; not a string) in place: its messages are
    shared with the session's next request and the memos built on them (gateway/frozen.py)."""
    items = getattr(request, history)
    if isinstance(items, list):
        items = freeze(items)
        setattr(request, history, items)
    return items


def inserted_at(old: bytes, new: bytes, end: int) -> bool:
    """Is `new` `old` with `,` + something inserted at `end`? (The rest: `[X]` parses.)"""
    return (
        len(new) - (len(old) - end) > end + 1
        and new[end] == _COMMA
        and new.startswith(memoryview(old)[:end])
        and new.endswith(memoryview(old)[end:])
    )


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings (memcmp by halves)."""
    n = min(len(a), len(b))
    view = memoryview(a)
    if b.startswith(view[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b.startswith(view[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def history_start(body: bytes, key: str, before: int) -> int:
    """Index of the `[` that opens `"key":`'s value in `body` (before `before`), or -1.
    Only a candidate: `proves_history` tells whether it is the top-level key's value."""
    found = re.compile(rb'"%s"[ \t\r\n]*:[ \t\r\n]*\[' % re.escape(key.encode())).search(
        body, 0, before
    )
    return -1 if found is None else found.end() - 1


def proves_history(body: bytes, start: int, end: int, key: str, count: int) -> bool:
    """Is `body[start:end + 1]` the array the parse took as `key` (its `count` items)?

    It is a whole array of `count` values, and with it replaced by `0` the body is an
    object whose `key` is 0: so that array is where the winning `key` lies (a later
    duplicate key would win instead; a nested one would leave `key` as it was)."""
    try:
        values = orjson.loads(memoryview(body)[start : end + 1])
        rest = orjson.loads(b"".join((memoryview(body)[:start], b"0", memoryview(body)[end + 1 :])))
    except orjson.JSONDecodeError:
        return False
    if not isinstance(values, list) or len(values) != count or not isinstance(rest, dict):
        return False
    marker = rest.get(key)
    return type(marker) is int and marker == 0
