"""Encoding a prompt whose beginning many sessions share (a long system prompt) once.

A prompt's *head* is its text up to the end of the first special token past
`min_chars`. A head seen twice has its ids kept, if the head's ids + the rest's equal
the whole's (checked once, on real text); then a prompt with it costs one digest and
the encoding of the rest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from gateway.lru import LRU


class HeadCache:
    def __init__(
        self,
        encode: Callable[[str], list[int]],
        special_tokens: list[str],
        *,
        min_chars: int = 512,
        size: int = 256,
    ) -> None:
        self._encode = encode
        alternatives = "|".join(re.escape(t) for t in sorted(special_tokens, key=len, reverse=True))
        self._special = re.compile(alternatives) if alternatives else None
        self.min_chars = min_chars
        # head digest -> the head's ids (a tuple: what a caller is given is its own list)
        self._ids: LRU[bytes, tuple[int, ...]] = LRU(size)
        # heads seen before: True once, False when their ids proved not to split off
        self._seen: LRU[bytes, bool] = LRU(size * 16)
        self.hits = 0
        self.refused = 0  # heads whose ids do not split off the whole's: never cached

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, as one encode of it would give."""
        long = self._special is not None and len(text) > self.min_chars
        m = self._special.search(text, self.min_chars) if long else None
        if m is None or m.end() >= len(text):
            return self._encode(text)
        cut = m.end()
        key = hashlib.blake2b(text[:cut].encode("utf-8", "surrogatepass"), digest_size=16).digest()
        ids = self._ids.get(key)
        if ids is not None:
            self.hits += 1
            return [*ids, *self._encode(text[cut:])]
        whole = self._encode(text)
        seen = self._seen.get(key)
        if seen is None:
            self._seen.put(key, True)
        elif seen:
            head = self._encode(text[:cut])
            if whole[: len(head)] == head and whole[len(head) :] == self._encode(text[cut:]):
                self._ids.put(key, tuple(head))
                self._seen.pop(key)
            else:
                self.refused += 1
                self._seen.put(key, False)
        return whole
