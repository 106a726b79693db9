"""Prompt ids that remember their JSON, so a long session's prompt is written once.

Every turn of a 64-turn session sends the engine its whole prompt, ~40k ids: writing
them as JSON cost ~0.2 ms a turn, growing with the session. A turn built on its
parent's ids (incremental prompts) starts from the parent's JSON and writes only the
ids after it.

Prompt ids are not changed once built. Ids appended after the JSON was written are
added to it; a list cut shorter is written again; ids changed in place would not be
seen, and nothing here changes them.
"""

from __future__ import annotations

from typing import Any

import orjson


class TokenIds(list[int]):
    __slots__ = ("_json", "_json_len")

    def __init__(self, ids: Any = ()) -> None:
        super().__init__(ids)
        self._json: bytes | None = None  # the JSON of self[: self._json_len]
        self._json_len = 0

    @classmethod
    def joined(cls, head: list[int], *rest: list[int]) -> TokenIds:
        """`head` + each of `rest`, copied once; `head`'s JSON, when it has one, is ours
        up to its length."""
        out = cls(head)
        for part in rest:
            out += part
        if isinstance(head, TokenIds) and head._json is not None and head._json_len == len(head):
            out._json, out._json_len = head._json, head._json_len
        return out

    def json(self) -> orjson.Fragment:
        """The ids as JSON (a fragment `orjson.dumps` writes as it is), kept for later."""
        n, known = len(self), self._json
        if known is None or self._json_len > n or self._json_len == 0:
            data = orjson.dumps(self)
        elif self._json_len == n:
            data = known
        else:  # "[...known" + "," + "new...]"
            tail = orjson.dumps(self[self._json_len :])
            data = b"".join((memoryview(known)[:-1], b",", memoryview(tail)[1:]))
        self._json, self._json_len = data, n
        return orjson.Fragment(data)


def as_json(ids: list[int]) -> Any:
    """What to put in an engine request body for `ids`: their kept JSON where they have
    it, else the list."""
    return ids.json() if isinstance(ids, TokenIds) else ids
