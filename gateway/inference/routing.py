"""Choosing one of several inference servers for a request.

A multi-turn conversation runs fastest on the server that served its previous turn:
that server still holds the conversation's prefix in its KV (radix) cache. So the
first request of a route key (the gateway uses the session id) goes to the least
loaded server, and later requests of the same key stick to it. The key -> server map
is bounded (least recently used keys are forgotten first).

A server that refused a connection is skipped for `cooldown_s`; its keys move to
another server on their next request.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence


class StickyRouter:
    def __init__(
        self, urls: Sequence[str], max_keys: int = 100_000, cooldown_s: float = 5.0
    ) -> None:
        if not urls:
            raise ValueError("StickyRouter needs at least one server URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate server URLs: {list(urls)}")
        self.urls = list(urls)
        self.max_keys = max_keys
        self.cooldown_s = cooldown_s
        self._keys: OrderedDict[str, str] = OrderedDict()  # route key -> url, LRU order
        self.inflight = dict.fromkeys(self.urls, 0)  # requests out per server
        self.assigned = dict.fromkeys(self.urls, 0)  # route keys held per server
        self._down_until = dict.fromkeys(self.urls, 0.0)
        self._turn = itertools.count()  # rotates ties so equal servers share new keys

    def __len__(self) -> int:
        return len(self._keys)

    def server_for(self, key: str) -> str | None:
        """The server a key is pinned to (None: not seen, or forgotten)."""
        return self._keys.get(key)

    def pick(self, key: str | None = None, exclude: Iterable[str] = ()) -> str:
        """The server for this request: the key's own server, else the least loaded."""
        excluded = set(exclude)
        if key is not None:
            url = self._keys.get(key)
            if url is not None and url not in excluded and self.is_up(url):
                self._keys.move_to_end(key)
                return url
        url = self._least_loaded(excluded)
        if key is not None:
            self._assign(key, url)
        return url

    def acquire(self, url: str) -> None:
        self.inflight[url] += 1

    def release(self, url: str) -> None:
        self.inflight[url] = max(0, self.inflight[url] - 1)

    def mark_down(self, url: str) -> None:
        self._down_until[url] = time.monotonic() + self.cooldown_s

    def mark_up(self, url: str) -> None:
        self._down_until[url] = 0.0

    def is_up(self, url: str) -> bool:
        return self._down_until[url] <= time.monotonic()

    def forget(self, key: str) -> None:
        url = self._keys.pop(key, None)
        if url is not None:
            self.assigned[url] -= 1

    # ---- internals -------------------------------------------------------------------
    def _least_loaded(self, excluded: set[str]) -> str:
        candidates = [u for u in self.urls if u not in excluded and self.is_up(u)]
        if not candidates:  # everything is down or excluded: try the rest anyway
            candidates = [u for u in self.urls if u not in excluded] or list(self.urls)
        turn = next(self._turn)
        n = len(self.urls)
        order = {u: (i - turn) % n for i, u in enumerate(self.urls)}
        return min(candidates, key=lambda u: (self.inflight[u], self.assigned[u], order[u]))

    def _assign(self, key: str, url: str) -> None:
        self.forget(key)
        self._keys[key] = url
        self.assigned[url] += 1
        while len(self._keys) > self.max_keys:
            _, evicted = self._keys.popitem(last=False)
            self.assigned[evicted] -= 1
