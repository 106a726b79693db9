"""At the default log level, `turnstile serve` logs no key and no prompt text.

A real `turnstile serve` process (fake engine) is driven through every kind of request,
good and bad, and its whole output is read back afterwards. Keys are compared in
constant time (hmac.compare_digest of SHA-256 digests for the admin key; session keys
are looked up by their SHA-256, never compared as text).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gateway_helpers import bearer

from gateway.auth import KeyRing, hash_key
from gateway.server import free_port
from gateway.store.database import open_database
from gateway.store.repository import Repository

SECRET = "pelican-saffron-7731"  # in prompts only
ADMIN = "admin-key-never-logged-5521"
SIGNING = "signing-key-never-logged-9034"


@pytest.fixture
def served(tmp_path: Path):
    """`turnstile serve --engine fake` on a free port; yields (url, log file)."""
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "trainer.cli", "serve", "--engine", "fake"]
    cmd += ["--port", str(port), "--database", str(tmp_path / "s.db"), "--admin-key", ADMIN]
    cmd += ["--signing-keys", SIGNING]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        yield url, log
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_no_key_or_prompt_text_in_logs(served) -> None:
    url, log = served
    admin = bearer(ADMIN)
    with httpx.Client(base_url=url, timeout=60) as http:
        r = http.post("/v1/sessions", headers=admin, json={"metadata": {"task": "t"}})
        sid, key = r.json()["id"], r.json()["api_key"]
        user = bearer(key)
        messages = [{"role": "user", "content": f"say {SECRET}"}]
        chat = http.post("/v1/chat/completions", headers=user, json={"messages": messages})
        assert chat.status_code == 200
        streamed = http.post(
            "/v1/chat/completions", headers=user, json={"messages": messages, "stream": True}
        )
        assert streamed.status_code == 200
        assert http.post("/v1/completions", headers=user, json={"prompt": SECRET}).is_success
        assert http.post("/v1/responses", headers=user, json={"input": SECRET}).is_success
        anthropic = {"max_tokens": 8, "messages": messages}
        assert http.post("/v1/messages", headers=user, json=anthropic).is_success
        cid = chat.json()["id"]
        http.post("/v1/rewards", headers=user, json={"completion_id": cid, "reward": 1})
        http.get(f"/v1/sessions/{sid}/export", headers=user)
        # the failures: wrong keys, bad bodies (with the secret in them), wrong roles
        wrong = "tsk-" + SECRET
        assert http.post("/v1/chat/completions", headers=bearer(wrong), json={}).status_code == 401
        assert http.get("/v1/sessions", headers=user).status_code == 403
        assert http.post("/v1/chat/completions", headers=admin, json={}).status_code == 401
        bad = http.post(
            "/v1/chat/completions",
            headers={**user, "content-type": "application/json"},
            content=f'{{"messages": [{{"role": "{SECRET}"'.encode(),
        )
        assert bad.status_code == 400
        odd = [{"role": SECRET, "content": SECRET}]
        assert http.post("/v1/chat/completions", headers=user, json={"messages": odd}).is_error
        http.post(f"/v1/sessions/{sid}/end", headers=user)
        assert http.post("/v1/chat/completions", headers=user, json={"messages": messages}).is_error
    text = log.read_text(errors="replace")
    assert "gateway ready" in text  # the log was captured, at the default level
    for secret in (SECRET, key, ADMIN, key[len("tsk-") :], SIGNING):
        assert secret not in text, f"{secret!r} appears in the log:\n{text}"


def test_keys_are_compared_in_constant_time(tmp_path, monkeypatch) -> None:
    """The admin key goes through hmac.compare_digest; a session key is found by its
    SHA-256 digest (an index lookup), so no text comparison touches the key itself."""
    import gateway.auth

    compared: list[tuple[bytes, bytes]] = []
    real = gateway.auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(gateway.auth.hmac, "compare_digest", spy)
    repo = Repository(open_database(tmp_path / "k.db"))
    ring = KeyRing(repo, ADMIN)
    assert ring.is_admin_key(ADMIN) and not ring.is_admin_key(ADMIN[:-1] + "x")
    assert not ring.is_admin_key("short")
    digest = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    # digests: equal lengths, so not even the key's length shows in the time taken
    assert compared == [
        (digest(ADMIN), digest(ADMIN)),
        (digest(ADMIN[:-1] + "x"), digest(ADMIN)),
        (digest("short"), digest(ADMIN)),
    ]
    key = "tsk-" + "k" * 43
    repo.create_session("sess-1", hash_key(key), 60, {})
    looked_up: list[str] = []
    monkeypatch.setattr(repo, "session_by_key_hash", lambda h: looked_up.append(h) or None)
    asyncio.run(ring.session_for_key("tsk-other"))
    assert looked_up == [hash_key("tsk-other")]  # the digest, never the key text


def test_database_errors_carry_no_parameters(tmp_path) -> None:
    """A failed statement's message (which the recorder logs) holds no prompt text."""
    repo = Repository(open_database(tmp_path / "p.db"))
    repo.create_session("sess-1", "h" * 64, 60, {"note": SECRET})
    with pytest.raises(Exception) as failure:
        repo.create_session("sess-1", "h" * 64, 60, {"note": SECRET})
    assert SECRET not in str(failure.value)
