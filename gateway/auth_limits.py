"""The abuse limit on failed key checks: a client that keeps offering keys that open
nothing is locked out (429, `Retry-After`) for a while, refused before its key is looked
at. docs/security.md ("Abuse limits") has the policy; the window slides on two counters
per client, not one timestamp per failure, so a request costs O(1).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import HTTPConnection

from gateway.errors import APIError
from gateway.lru import LRU

# clients tracked at most (about 250 bytes each)
MAX_CLIENTS = 65_536

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Failures:
    window: int  # the index of the fixed window `current` counts
    current: int = 0
    previous: int = 0  # in the window before `window`
    locked_until: float = 0.0


def client_of(request: HTTPConnection) -> str:
    """Whom failures are counted against: the peer's IPv4 address, or its IPv6 /64."""
    client = request.client
    host = client.host if client is not None else ""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


class AuthLimiter:
    """Counts failed key checks per client; refuses a client that had too many."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        lockout_s: float,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit > 0 and (window_s <= 0 or lockout_s < 0):
            raise ValueError("the auth failure window must be positive, the lockout not negative")
        self.limit = limit  # 0: no limit
        self.window_s = window_s
        self.lockout_s = lockout_s
        self.clock = clock
        self._clients: LRU[str, _Failures] = LRU(max_clients)
        self._any_locked_until = 0.0  # no client is locked out after this

    def check(self, request: HTTPConnection) -> None:
        """Raise the 429 while this request's client is locked out."""
        wait = self.retry_after(request)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise APIError(
                429,
                "Too many requests with an invalid API key from this address; "
                f"try again in {seconds} s.",
                code="too_many_invalid_keys",
                headers={"retry-after": str(seconds)},
            )

    def retry_after(self, request: HTTPConnection) -> float:
        """Seconds this request's client must still wait; 0 when it may offer a key."""
        now = self.clock()
        if now >= self._any_locked_until:  # nobody is locked out: nothing to look up
            return 0.0
        entry = self._clients.get(client_of(request))
        if entry is None or now >= entry.locked_until:
            return 0.0
        return entry.locked_until - now

    def failed(self, request: HTTPConnection) -> None:
        """Count one failed key check against this request's client."""
        if self.limit <= 0:
            return
        now = self.clock()
        position = now / self.window_s
        index = int(position)
        client = client_of(request)
        entry = self._clients.get(client)
        if entry is None:
            entry = _Failures(index)
            self._clients.put(client, entry)
        elif entry.window != index:
            entry.previous = entry.current if entry.window == index - 1 else 0
            entry.current, entry.window = 0, index
        entry.current += 1
        still_inside = 1.0 - (position - index)  # of the previous window, in the last window_s
        if entry.current + entry.previous * still_inside >= self.limit:
            entry.locked_until = now + self.lockout_s
            entry.current = entry.previous = 0
            self._any_locked_until = max(self._any_locked_until, entry.locked_until)
            log.warning(
                "client %s locked out for %.0f s: %d invalid keys within %.0f s",
                client, self.lockout_s, self.limit, self.window_s,
            )  # fmt: skip

    def __len__(self) -> int:
        return len(self._clients)
