"""Keys: an admin key for operators, one API key per session for agents.

Session keys are stored only as SHA-256 hashes. A small in-memory cache keeps the
hot path off the database; its entries live a short time so that a session ended
through another gateway replica stops working within seconds.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from fastapi import Request

from gateway.errors import APIError
from gateway.lru import LRU
from gateway.store.repository import Repository, SessionInfo

KEY_PREFIX = "tsk-"


def new_session_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


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
    def __init__(
        self,
        repo: Repository,
        admin_key: str | None,
        cache_ttl_s: float = 2.0,
        cache_size: int = 100_000,
    ) -> None:
        self.repo = repo
        self.admin_key = admin_key
        self.cache_ttl_s = cache_ttl_s
        self._cache: LRU[str, tuple[float, SessionInfo]] = LRU(cache_size)

    def is_admin_key(self, key: str | None) -> bool:
        if self.admin_key is None:
            return True  # loopback-only mode: no admin key configured
        return key is not None and hmac.compare_digest(key.encode(), self.admin_key.encode())

    def session_for_key(self, key: str) -> SessionInfo | None:
        digest = hash_key(key)
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self.cache_ttl_s:
            return hit[1]
        info = self.repo.session_by_key_hash(digest)
        if info is not None:
            self._cache.put(digest, (now, info))
        return info

    def forget(self, session_id: str) -> None:
        for digest, (_, info) in self._cache.items():
            if info.id == session_id:
                self._cache.pop(digest)

    def remember(self, key: str, info: SessionInfo) -> None:
        self._cache.put(hash_key(key), (time.monotonic(), info))

    def resolve(self, request: Request, *, allow_admin: bool, allow_ended: bool = False) -> Caller:
        key = bearer_token(request)
        if key and key.startswith(KEY_PREFIX):
            info = self.session_for_key(key)
            if info is None:
                raise APIError(
                    401, "Incorrect API key provided.", code="invalid_api_key", retryable=False
                )
            if info.ended and not allow_ended:
                raise APIError(
                    410,
                    f"Session {info.id} has ended; its key no longer works.",
                    code="session_ended",
                    retryable=False,
                )
            if info.expired():
                raise APIError(
                    401,
                    f"The API key of session {info.id} has expired.",
                    code="expired_api_key",
                    retryable=False,
                )
            return Caller(is_admin=False, session=info)
        if allow_admin and self.is_admin_key(key):
            return Caller(is_admin=True)
        if not allow_admin and self.admin_key is not None and self.is_admin_key(key):
            raise APIError(
                401,
                "This endpoint needs a session API key; create a session with the admin key first.",
                code="session_key_required",
                retryable=False,
            )
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key", retryable=False)
