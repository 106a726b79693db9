"""Keys: an admin key for operators, one API key per session for agents.

Session keys are stored only as SHA-256 hashes; an in-memory cache keeps the hot path
off the database. A session ended through another replica stops working within seconds:
a background task asks the store every `end_poll_s` which sessions ended lately (one
query per poll, however many sessions are live, not one per cached key). Store reads
run off the event loop: against a shared PostgreSQL each is a network round trip.

A refused key learns nothing (docs/security.md): a missing, malformed, unknown or
expired key gets one and the same 401, and keys are never compared as text.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from fastapi import Request
from sqlalchemy.exc import SQLAlchemyError

from gateway.auth_limits import AuthLimiter
from gateway.errors import APIError
from gateway.frozen import freeze
from gateway.lru import LRU
from gateway.store.repository import Repository, SessionInfo

KEY_PREFIX = "tsk-"
# how far two replicas' clocks may disagree: the end-of-session poll looks back this much
CLOCK_SKEW_S = 30.0

log = logging.getLogger(__name__)


def new_session_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def invalid_key() -> APIError:
    """The one answer to a key that opens nothing, whatever is wrong with it."""
    return APIError(
        401,
        "Invalid API key: it is missing, malformed, unknown or expired.",
        code="invalid_api_key",
    )


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip()
    return request.headers.get("x-api-key")


@dataclass(slots=True)
class Caller:
    """Who is calling: the admin, or the holder of one session's key."""

    is_admin: bool
    session: SessionInfo | None = None

    def may_touch(self, session_id: str) -> bool:
        return self.is_admin or (self.session is not None and self.session.id == session_id)


class KeyRing:
    end_poll_s = 2.0
    max_age_s = 60.0  # a backstop: re-read a key this old anyway

    def __init__(
        self,
        repo: Repository,
        admin_key: str | None,
        cache_size: int = 100_000,
        limiter: AuthLimiter | None = None,
    ) -> None:
        self.repo = repo
        self.admin_key = admin_key
        # its digest, compared in constant time with an offered key's: equal lengths, so
        # not even the key's length shows in the time a comparison takes
        self._admin_digest = None if admin_key is None else hash_key(admin_key)
        self.limiter = limiter if limiter is not None else AuthLimiter(0, 60.0, 60.0)
        # by the key itself: a request that hits hashes nothing (the store keeps digests)
        self._cache: LRU[str, tuple[float, SessionInfo]] = LRU(cache_size)
        self._keys: LRU[str, str] = LRU(cache_size)  # session id -> its key
        # what else keeps a session's state (its answers, bodies): told when the session
        # ends, here or (through the poll) on another replica, so that they drop it
        self.on_end: list[Callable[[str], None]] = []
        self._ended_since = time.time() - CLOCK_SKEW_S

    def is_admin_key(self, key: str | None) -> bool:
        if self._admin_digest is None:
            return True  # loopback-only mode: no admin key configured
        return key is not None and hmac.compare_digest(hash_key(key), self._admin_digest)

    def check_admin(self, request: Request, key: str | None) -> bool:
        """Is `key` the admin key? For a page that takes no other key (/ui): a 429 while
        this client is locked out, and a key that is not the admin key counts against it."""
        self.limiter.check(request)
        if self.is_admin_key(key):
            return True
        if key:
            self.limiter.failed(request)
        return False

    async def session_for_key(self, key: str) -> SessionInfo | None:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.max_age_s:
            return hit[1]
        info = await asyncio.to_thread(self.repo.session_by_key_hash, hash_key(key))
        return self.remember(key, info, now) if info is not None else None

    async def poll_ended(self) -> None:
        """Every `end_poll_s` (until cancelled), forget the sessions the store says ended
        since the last poll (on any replica; their end time is that replica's clock, hence
        the overlap of `CLOCK_SKEW_S`)."""
        while True:
            await asyncio.sleep(self.end_poll_s)
            wall = time.time()
            try:
                ended = await asyncio.to_thread(self.repo.sessions_ended_since, self._ended_since)
                for session_id in ended:
                    self.forget(session_id)
            except SQLAlchemyError:
                log.warning("could not reach the store for ended sessions; polling again soon")
                continue
            except Exception:  # the poll must outlive any one failure
                log.exception("forgetting the sessions that ended failed")
                continue
            self._ended_since = wall - CLOCK_SKEW_S

    def forget(self, session_id: str) -> None:
        """The session ended: its key and everything kept for its next turns go."""
        key = self._keys.pop(session_id)
        if key is not None:
            self._cache.pop(key)
        for drop in self.on_end:
            drop(session_id)

    def remember(self, key: str, info: SessionInfo, now: float | None = None) -> SessionInfo:
        """Keep `info` for `key` (read at `now`); returns the kept copy, frozen: every
        request of the session is handed the same one, so none can change what the next
        one sees."""
        info = replace(
            info, meta=freeze(info.meta), sampling=freeze(info.sampling), quotas=freeze(info.quotas)
        )
        self._cache.put(key, (time.monotonic() if now is None else now, info))
        self._keys.put(info.id, key)
        return info

    async def resolve(
        self, request: Request, *, allow_admin: bool, allow_ended: bool = False
    ) -> Caller:
        self.limiter.check(request)  # before the key is looked at: a lockout tells nothing
        key = bearer_token(request)
        if key and key.startswith(KEY_PREFIX):
            info = await self.session_for_key(key)
            if info is None or info.expired():  # the same answer: existing tells nothing
                raise self._refuse(request)
            if info.ended and not allow_ended:  # only a live key gets here
                raise APIError(
                    410,
                    f"Session {info.id} has ended; its key no longer works.",
                    code="session_ended",
                )
            return Caller(is_admin=False, session=info)
        if allow_admin and self.is_admin_key(key):
            return Caller(is_admin=True)
        if not allow_admin and self.admin_key is not None and self.is_admin_key(key):
            raise APIError(
                401,
                "This endpoint needs a session API key; create a session with the admin key first.",
                code="session_key_required",
            )
        if not key:  # nothing offered, nothing guessed: not counted
            raise invalid_key()
        raise self._refuse(request)

    def _refuse(self, request: Request) -> APIError:
        """The 401 for a key that opens nothing, counted against its client."""
        self.limiter.failed(request)
        return invalid_key()
