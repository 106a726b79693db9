"""Abuse limits on keys (issue 31, docs/security.md "Abuse limits"): a client that keeps
offering keys that open nothing is refused with a 429 in the API's own error shape, with
`Retry-After`, and other clients are not; and no answer tells whether a key exists.

Over HTTP against real gateways (fake engine). Two clients are two source addresses on
the loopback network (127.0.0.1 and 127.0.0.2), so the gateway sees two peers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from anthropic_helpers import anthropic_headers, assert_anthropic_error, root
from gateway_helpers import (
    ADMIN_KEY,
    HTTP_TIMEOUT,
    admin_headers,
    assert_error_shape,
    bearer,
    http_client,
)
from starlette.requests import Request

from gateway.auth_limits import AuthLimiter, client_of
from gateway.errors import APIError

MESSAGES = [{"role": "user", "content": "Hi"}]
CHAT = {"model": "m", "messages": MESSAGES}
ANTHROPIC = {"model": "m", "max_tokens": 8, "messages": MESSAGES}
UNKNOWN = "tsk-" + "u" * 43  # the shape of a real key, never issued


@pytest.fixture
def other_client() -> Iterator[httpx.Client]:
    """A second client: requests from 127.0.0.2."""
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=HTTP_TIMEOUT) as client:
        yield client


def chat(http: httpx.Client, gw: Any, headers: dict[str, str]) -> httpx.Response:
    return http.post(f"{gw.url}/chat/completions", headers=headers, json=CHAT)


def messages(http: httpx.Client, gw: Any, key: str) -> httpx.Response:
    return http.post(f"{root(gw.url)}/v1/messages", headers=anthropic_headers(key), json=ANTHROPIC)


def retry_after(response: httpx.Response, most: float) -> int:
    seconds = int(response.headers["retry-after"])
    assert 1 <= seconds <= max(1, most), response.headers
    return seconds


# ---- 429 after repeated bad keys -------------------------------------------------------
def test_repeated_bad_keys_are_refused_with_429_and_other_clients_are_not(
    gateway_factory, new_session, other_client
):
    """Five bad keys of every kind from 127.0.0.2 (the limit): then every request it
    makes with a key, valid or not, on every kind of route, is a 429 in that route's
    error shape with Retry-After, before the key is checked; 127.0.0.1 is served as
    before; after the lockout 127.0.0.2 is served again."""
    gw = gateway_factory(config={"auth_failure_limit": 5, "auth_lockout_s": 3.0})
    sid, key = new_session(gw)
    attacker, ui = other_client, f"{root(gw.url)}/ui"
    failures = [
        lambda: chat(attacker, gw, bearer(UNKNOWN)),
        lambda: attacker.get(f"{gw.url}/models", headers=bearer("not-a-key")),
        lambda: attacker.get(f"{gw.url}/sessions", headers=bearer("wrong-admin")),
        lambda: messages(attacker, gw, "tsk-short"),
        lambda: attacker.get(f"{ui}/sessions", params={"key": "wrong-admin"}),
    ]
    for fail in failures:
        assert fail().status_code == 401
    started = time.monotonic()

    r = chat(attacker, gw, bearer(key))  # a valid key: refused all the same (no oracle)
    err = assert_error_shape(r, 429)
    assert err["type"] == "rate_limit_error" and err["code"] == "too_many_invalid_keys"
    assert r.headers["x-should-retry"] == "true"
    retry_after(r, 3)
    r = messages(attacker, gw, key)
    assert_anthropic_error(r, 429, "rate_limit_error")
    retry_after(r, 3)
    r = attacker.get(f"{gw.url}/sessions/{sid}", headers=admin_headers())
    assert assert_error_shape(r, 429)["code"] == "too_many_invalid_keys"
    r = attacker.get(f"{ui}/sessions", headers=admin_headers())
    assert r.status_code == 429 and "text/html" in r.headers["content-type"]
    assert "try again in" in r.text
    retry_after(r, 3)
    r = attacker.get(f"{ui}/runs/0/metrics.json", headers=admin_headers())
    assert assert_error_shape(r, 429)["code"] == "too_many_invalid_keys"
    assert chat(attacker, gw, bearer(UNKNOWN)).status_code == 429  # not even checked
    assert attacker.get(f"{root(gw.url)}/healthz").status_code == 200  # takes no key

    with http_client() as http:  # 127.0.0.1: another client, unaffected
        assert chat(http, gw, bearer(key)).status_code == 200
        assert messages(http, gw, key).status_code == 200
        assert http.get(f"{ui}/sessions", headers=admin_headers()).status_code == 200
        assert chat(http, gw, bearer(UNKNOWN)).status_code == 401

    time.sleep(max(0.0, 3.05 - (time.monotonic() - started)))
    assert chat(attacker, gw, bearer(key)).status_code == 200  # the lockout is over
    assert chat(attacker, gw, bearer(UNKNOWN)).status_code == 401  # counted from zero


def test_only_keys_that_open_nothing_count(gateway_factory, new_session, http):
    """No key, a valid key used where it may not be (403, 404, 410,
    `session_key_required`), and the key form without a key are not failures: many of
    each never lock the client out. Three invalid keys then do."""
    gw = gateway_factory(config={"auth_failure_limit": 3})
    sid, key = new_session(gw)
    other_sid, _ = new_session(gw)
    ended_sid, ended_key = new_session(gw)
    assert http.post(f"{gw.url}/sessions/{ended_sid}/end", headers=admin_headers()).is_success
    ui = f"{root(gw.url)}/ui/sessions"
    for _ in range(5):
        assert chat(http, gw, {}).status_code == 401
        assert chat(http, gw, admin_headers()).status_code == 401  # session_key_required
        assert http.get(f"{gw.url}/sessions", headers=bearer(key)).status_code == 403
        assert http.get(f"{gw.url}/sessions/{other_sid}", headers=bearer(key)).status_code == 404
        assert chat(http, gw, bearer(ended_key)).status_code == 410
        assert http.get(ui).status_code == 401
    for _ in range(3):
        assert chat(http, gw, bearer(UNKNOWN)).status_code == 401
    assert chat(http, gw, bearer(key)).status_code == 429
    assert sid != other_sid


def test_a_stale_viewer_cookie_is_cleared_and_a_wrong_key_never_kept(gateway_factory, http):
    """A cookie that is not the admin key (the key was changed) is cleared by the key
    form, so a browser does not offer it again on every page; a `?key=` that is not the
    admin key is not put in the cookie even beside a valid admin header."""
    gw = gateway_factory()
    ui = f"{root(gw.url)}/ui/sessions"
    r = http.get(ui, headers={"Cookie": "turnstile_admin=old-key"})
    assert r.status_code == 401 and 'id="bad-key"' in r.text
    assert (
        'turnstile_admin=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    )
    r = http.get(ui, params={"key": "mistyped"}, headers=admin_headers(), follow_redirects=False)
    assert r.status_code == 303 and "set-cookie" not in r.headers
    assert "key=" not in r.headers["location"]
    r = http.get(ui, params={"key": ADMIN_KEY}, follow_redirects=False)
    assert r.status_code == 303 and f"turnstile_admin={ADMIN_KEY}" in r.headers["set-cookie"]


# ---- the limiter itself, on a clock of our own --------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def peer(host: str) -> Request:
    return Request({"type": "http", "client": (host, 40000), "headers": []})


def test_the_window_slides_and_the_lockout_ends():
    """3 failures within 10 s lock out for 30 s. Failures at 5 s and 6 s, then at 12 s:
    2 in the window before (80% of it still inside the last 10 s) + 1 = 2.6, not yet;
    at 13 s 3.6: locked (a fixed window would count only 2). Then starts from zero."""
    clock = Clock()
    limiter = AuthLimiter(3, 10.0, 30.0, clock=clock)
    client = peer("203.0.113.7")
    for t in (5.0, 6.0, 12.0):
        clock.now = t
        limiter.failed(client)
        assert limiter.retry_after(client) == 0
    clock.now = 13.0
    limiter.failed(client)
    assert limiter.retry_after(client) == 30.0
    assert limiter.retry_after(peer("203.0.113.8")) == 0  # another client
    clock.now = 42.5
    assert limiter.retry_after(client) == pytest.approx(0.5)
    with pytest.raises(APIError) as refused:
        limiter.check(client)
    assert refused.value.status == 429 and refused.value.headers == {"retry-after": "1"}
    clock.now = 43.0
    assert limiter.retry_after(client) == 0
    limiter.failed(client)
    assert limiter.retry_after(client) == 0  # counted from zero again


def test_failures_spread_out_never_lock():
    clock = Clock()
    limiter = AuthLimiter(3, 10.0, 30.0, clock=clock)
    client = peer("203.0.113.7")
    for i in range(50):  # one every 6 s: at most 2.x in any 10 s
        clock.now = 6.0 * i
        limiter.failed(client)
        assert limiter.retry_after(client) == 0


def test_clients_are_addresses_ipv6_by_64_and_memory_is_bounded(monkeypatch):
    assert client_of(peer("192.0.2.1")) == "192.0.2.1"
    assert client_of(peer("2001:db8::1")) == client_of(peer("2001:db8::ffff:2")) == "2001:db8::/64"
    assert client_of(peer("2001:db8:0:1::1")) == "2001:db8:0:1::/64"
    assert client_of(peer("::ffff:192.0.2.1")) == "192.0.2.1"
    assert client_of(Request({"type": "http", "headers": []})) == ""  # no peer (a test client)

    limiter = AuthLimiter(2, 60.0, 60.0, max_clients=4)
    for i in range(100):
        limiter.failed(peer(f"198.51.100.{i}"))
    assert len(limiter) == 4
    limiter.failed(peer("2001:db8::1"))
    limiter.failed(peer("2001:db8::2"))  # the same /64: its second failure
    assert limiter.retry_after(peer("2001:db8::3")) > 0

    # while nobody is locked out a request does not even look its client up
    free = AuthLimiter(2, 60.0, 60.0)
    free.failed(peer("192.0.2.1"))
    monkeypatch.setattr(free._clients, "get", lambda _k: pytest.fail("looked up"))
    assert free.retry_after(peer("192.0.2.1")) == 0


def test_limit_zero_is_no_limit():
    limiter = AuthLimiter(0, 0.0, 60.0)
    for _ in range(1000):
        limiter.failed(peer("192.0.2.1"))
    assert limiter.retry_after(peer("192.0.2.1")) == 0 and len(limiter) == 0


# ---- no answer tells whether a key exists ----------------------------------------------
def _answer(r: httpx.Response) -> tuple[int, bytes, dict[str, str]]:
    """Everything a client sees, except the date."""
    headers = {k: v for k, v in r.headers.items() if k not in ("date",)}
    return r.status_code, r.content, headers


def test_a_refused_key_tells_nothing(gateway_factory, new_session, http):
    """A missing, malformed, unknown or expired key, and an ended session's expired key,
    get byte for byte the same answer on each kind of route (generating, Anthropic,
    admin, read, viewer). Only a live session's own key is told its session ended (410);
    an ended one still reads its own session (200)."""
    gw = gateway_factory(config={"auth_failure_limit": 0})  # nothing locked out here
    sid, key = new_session(gw)
    expired_sid, expired = new_session(gw, ttl_seconds=0.5)
    ended_sid, ended_expired = new_session(gw, ttl_seconds=0.5)
    ended_live_sid, ended_live = new_session(gw)
    for k in (expired, ended_expired):
        assert chat(http, gw, bearer(k)).status_code == 200  # now cached as valid
    for s in (ended_sid, ended_live_sid):
        assert http.post(f"{gw.url}/sessions/{s}/end", headers=admin_headers()).is_success
    time.sleep(0.6)

    refused: dict[str, dict[str, str] | dict[str, bytes]] = {
        "none": {},
        "bare scheme": {"Authorization": "Bearer"},
        "other scheme": {"Authorization": f"Basic {UNKNOWN}"},
        "prefix only": bearer("tsk-"),
        "unknown": bearer(UNKNOWN),
        "unknown, one character off a real key": bearer(
            key[:-1] + ("A" if key[-1] != "A" else "B")
        ),
        "not a session key": bearer("sk-proj-abc"),
        "wrong admin key": bearer(ADMIN_KEY + "x"),
        "long": bearer("tsk-" + "z" * 8000),
        "latin-1 bytes": {"Authorization": b"Bearer tsk-\xe9\xff"},
        "expired": bearer(expired),
        "ended and expired": bearer(ended_expired),
    }
    routes = {
        "chat": lambda h: http.post(f"{gw.url}/chat/completions", headers=h, json=CHAT),
        "messages": lambda h: http.post(f"{root(gw.url)}/v1/messages", headers=h, json=ANTHROPIC),
        "admin": lambda h: http.get(f"{gw.url}/sessions", headers=h),
        "read": lambda h: http.get(f"{gw.url}/sessions/{sid}", headers=h),
        "viewer": lambda h: http.get(f"{root(gw.url)}/ui/sessions", headers=h),
    }
    for route, call in routes.items():
        answers = {name: _answer(call(headers)) for name, headers in refused.items()}
        first = answers["unknown"]
        assert first[0] == 401, (route, first)
        differ = {name for name, a in answers.items() if a != first}
        # the key form says "that key is not the admin key" when a key came at all
        expected = {"none", "bare scheme", "other scheme"} if route == "viewer" else set()
        assert differ == expected, (route, differ)
        for a in answers.values():
            for secret in (key, expired, ended_expired, sid, expired_sid, ended_sid):
                assert secret.encode() not in a[1], (route, secret)
    # the same key with x-api-key (Anthropic's header) on the Anthropic route
    unknown = http.post(
        f"{root(gw.url)}/v1/messages", headers=anthropic_headers(UNKNOWN), json=ANTHROPIC
    )
    r = http.post(f"{root(gw.url)}/v1/messages", headers=anthropic_headers(expired), json=ANTHROPIC)
    assert _answer(r) == _answer(unknown)
    assert_anthropic_error(r, 401, "authentication_error")

    # the one exception: a live key of an ended session, told so; it still reads its own
    err = assert_error_shape(chat(http, gw, bearer(ended_live)), 410)
    assert err["code"] == "session_ended"
    r = http.get(f"{gw.url}/sessions/{ended_live_sid}", headers=bearer(ended_live))
    assert r.status_code == 200
