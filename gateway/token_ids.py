"""Prompt ids built on a parent's without copying them, and kept with their JSON.

A turn of a 64-turn session has ~40k prompt ids, a few hundred of them new. As a list,
every turn copied the whole prompt (~0.2 ms at 40k) and an evicted parent freed it id
by id. A `TokenIds` is an immutable sequence of chunks shared with its parent: joining
costs the same whatever the length. Its JSON is kept as parts too (the parent's, then
the turn's own ids), so the engine client (gateway/inference/remote.py) writes no id
twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import overload

import orjson


class TokenIds(Sequence[int]):
    __slots__ = ("_chunks", "_len", "_flat", "_parts", "_json_len")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        first = list(ids)
        self._chunks: tuple[list[int], ...] = (first,)
        self._len = len(first)
        self._flat: list[int] | None = first  # all ids in one list, once someone needs it
        # the first `_json_len` ids as JSON in parts (see `json_parts`): written once,
        # shared with the turns built on them
        self._parts: tuple[bytes, ...] = ()
        self._json_len = 0

    @classmethod
    def joined(cls, head: Sequence[int], *rest: Sequence[int]) -> TokenIds:
        """`head` + each of `rest`: `head`'s chunks shared (a list's copied), `rest`
        copied (short: an answer, new messages' ids). `head`'s JSON is kept for ours."""
        out = cls.__new__(cls)
        parts = tuple(list(p) for p in rest if len(p))
        base = head if type(head) is TokenIds else cls(head)
        out._chunks = base._chunks + parts
        out._len = base._len + sum(map(len, parts))
        out._parts, out._json_len = base._parts, base._json_len  # see `json_parts`
        out._flat = None if parts else base._flat
        return out

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._chunks)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step == 1 and stop == self._len and self._flat is None:
                return self.tail(start)
            return self.flat()[index]
        if -len(self._chunks[-1]) <= index < 0:
            return self._chunks[-1][index]
        return self.flat()[index]

    def tail(self, start: int) -> list[int]:
        """`self[start:]`, read off the last chunks (a turn's ids after its parent's)."""
        need, parts = self._len - start, []
        for chunk in reversed(self._chunks):
            if need <= 0:
                break
            parts.append(chunk)
            need -= len(chunk)
        if need > 0:
            return self.flat()[start:]
        out = list(chain.from_iterable(reversed(parts)))
        return out[-need:] if need < 0 else out  # (need < 0: the first part is cut)

    def flat(self) -> list[int]:
        """All the ids in one list (made once; a turn on the hot path never asks)."""
        if self._flat is None:
            self._flat = list(chain.from_iterable(self._chunks))
        return self._flat

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self._len == other._len and self.flat() == other.flat()
        if isinstance(other, list):
            return self._len == len(other) and self.flat() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[int]) -> list[int]:
        return [*self, *other]

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"TokenIds({self.flat()!r})"

    def json_parts(self) -> tuple[bytes, ...]:
        """The ids as JSON, kept in parts (the parent's, then each turn's own ids) whose
        concatenation + `]` is the array: a turn built on this one writes only its ids."""
        if self._json_len < self._len or not self._parts:
            if self._json_len == 0:
                part = orjson.dumps(self.flat())[:-1]  # "[1,2,3"
            else:
                part = b"," + orjson.dumps(self.tail(self._json_len))[1:-1]  # ",4,5"
            self._parts = (*self._parts, part) if self._json_len else (part,)
            self._json_len = self._len
        return self._parts


def json_object_with_ids(
    key: str, ids: Sequence[int], rest: bytes
) -> tuple[bytes | memoryview, ...]:
    """`{"<key>": ids, ...rest}` as JSON (`rest`: the other fields as a JSON object), in
    parts whose concatenation is the object: a 40k-token prompt's ids are written as
    JSON once, in the turn that added them."""
    head = b'{"%s":' % key.encode()
    parts = ids.json_parts() if type(ids) is TokenIds else (orjson.dumps(list(ids))[:-1],)
    if len(rest) <= 2:  # {}
        return (head, *parts, b"]}")
    return (head, *parts, b"],", memoryview(rest)[1:])
