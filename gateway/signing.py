"""The keys the gateway signs with what it hands a client and later takes back as its
own (today: the `signature` of its Anthropic `thinking` blocks, which then count as the
model's generated reasoning).

No key is a constant of the source: they are configured (`signing_keys`; the first
signs, all verify) or kept in the store, so every replica of one database signs and
verifies alike; an older stored key verifies for `grace_s` after a newer one is made.
A signature is bound to the session it was handed to, so a block replayed in another
session is not its own. docs/security.md ("The signature") has the details.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from gateway.store.repository import Repository

_SIGNATURE = re.compile(r"tsig_([0-9a-f]{12})_([0-9a-f]{48})")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SigningKey:
    id: str
    secret: bytes
    retired_at: float | None = None  # when a newer key was made (None: never, or configured)


def key_id(signature: str) -> str | None:
    """The id of the key a signature claims (None: not one of the gateway's form)."""
    m = _SIGNATURE.fullmatch(signature)
    return m.group(1) if m else None


class Signer:
    """This deployment's signing keys: the current one signs, the valid ones verify."""

    refresh_s = 30.0  # how soon a key made on another replica signs here
    min_reload_s = 1.0  # the most often an unknown key id reads the store

    def __init__(self, repo: Repository, configured: str | None, grace_s: float) -> None:
        self.repo = repo
        self.grace_s = grace_s
        given = [_configured(s.strip()) for s in (configured or "").split(",") if s.strip()]
        self.configured = bool(given)
        self._keys: dict[str, SigningKey] = {k.id: k for k in given}
        self._current: SigningKey | None = given[0] if given else None
        self._loaded = 0.0
        self.load()

    def load(self) -> None:
        """Read the stored keys (the newest signs; each older one retired when the next
        one was made)."""
        if self.configured:
            return
        rows = self.repo.signing_keys()
        if not rows:  # the migration makes the first one; a store emptied by hand
            self.rotate()
            return
        keys = [
            SigningKey(kid, bytes.fromhex(secret), rows[i + 1][2] if i + 1 < len(rows) else None)
            for i, (kid, secret, _) in enumerate(rows)
        ]
        self._keys, self._current = {k.id: k for k in keys}, keys[-1]
        self._loaded = time.monotonic()

    async def refresh(self, key_ids: Iterable[str] = ()) -> None:
        """Re-read the store's keys every `refresh_s`, or sooner (at most every
        `min_reload_s`) for a signature under a key this replica does not know yet."""
        if self.configured:
            return
        since = time.monotonic() - self._loaded
        unknown = any(k not in self._keys for k in key_ids)
        if since < self.refresh_s and not (unknown and since >= self.min_reload_s):
            return
        self._loaded = time.monotonic()  # one reload at a time, whatever it finds
        try:
            await asyncio.to_thread(self.load)
        except SQLAlchemyError:
            log.warning("could not reach the store for signing keys; using those known")

    def rotate(self) -> str:
        """Make a new stored key current (on every replica within `refresh_s`)."""
        if self.configured:
            raise ValueError("the signing keys are configured: rotate them in the setting")
        kid = secrets.token_hex(6)
        self.repo.add_signing_key(kid, secrets.token_hex(32), time.time())
        self.load()
        return kid

    def sign(self, purpose: str, session_id: str, text: str) -> str:
        key = self._current
        assert key is not None
        return f"tsig_{key.id}_{_digest(key, purpose, session_id, text)}"

    def verify(self, purpose: str, session_id: str, text: str, signature: str) -> bool:
        """Did this deployment sign `text` for this session, under a key still valid?"""
        m = _SIGNATURE.fullmatch(signature)
        key = self._keys.get(m.group(1)) if m else None
        if m is None or key is None:
            return False
        if key.retired_at is not None and time.time() > key.retired_at + self.grace_s:
            return False
        return hmac.compare_digest(m.group(2), _digest(key, purpose, session_id, text))


def _configured(secret: str) -> SigningKey:
    kid = hashlib.sha256(b"turnstile signing key id\0" + secret.encode()).hexdigest()[:12]
    return SigningKey(kid, secret.encode())


def _digest(key: SigningKey, purpose: str, session_id: str, text: str) -> str:
    message = b"\0".join((purpose.encode(), session_id.encode(), text.encode()))
    return hmac.new(key.secret, message, hashlib.sha256).hexdigest()[:48]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gateway.signing",
        description="Make a new signing key current in a store: its replicas sign with it "
        "within 30 s; signatures under the older keys verify for the grace period "
        "(--signing-key-grace-s).",
    )
    p.add_argument("--database", required=True, help="SQLite file path or SQLAlchemy URL")
    args = p.parse_args(argv)
    from gateway.store.database import open_database

    kid = Signer(Repository(open_database(args.database)), None, 0.0).rotate()
    print(f"signing key {kid} is current")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
