"""Per-session quotas: max requests, max generated tokens, max concurrent requests.

Past a quota the answer is a 429 with code `quota_exceeded`, and GET /v1/sessions/{id}
shows each limit with what the session has used of it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from gateway_helpers import admin_headers, assert_error_shape, bearer


def new_session(http: httpx.Client, url: str, **quotas: int) -> tuple[str, str]:
    r = http.post(f"{url}/sessions", headers=admin_headers(), json={"quotas": quotas})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["api_key"]


def chat(http: httpx.Client, url: str, key: str, **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "2+2?"}], **extra}
    return http.post(f"{url}/chat/completions", headers=bearer(key), json=body)


def quotas_of(http: httpx.Client, url: str, sid: str) -> dict[str, Any]:
    return http.get(f"{url}/sessions/{sid}", headers=admin_headers()).json()["quotas"]


def test_max_requests_then_429_and_visible(fake_gateway, http) -> None:
    url = fake_gateway.url
    sid, key = new_session(http, url, max_requests=2)
    assert chat(http, url, key).status_code == 200
    assert chat(http, url, key, stream=True).status_code == 200
    r = chat(http, url, key)
    err = assert_error_shape(r, 429)
    assert err["code"] == "quota_exceeded" and err["param"] == "quotas.max_requests"
    assert r.headers["x-should-retry"] == "false"  # a retry cannot help
    q = quotas_of(http, url, sid)
    assert q["max_requests"] == 2 and q["requests"] == 2 and q["concurrent_requests"] == 0
    assert q["max_generated_tokens"] is None
    # the refused request recorded nothing; reading and rewarding still work
    body = http.get(f"{url}/sessions/{sid}", headers=bearer(key)).json()
    assert body["stats"]["num_completions"] == 2


def test_max_generated_tokens_caps_then_refuses(fake_gateway, http) -> None:
    url = fake_gateway.url
    _, probe_key = new_session(http, url)
    full = chat(http, url, probe_key).json()["usage"]["completion_tokens"]
    assert full >= 3
    sid, key = new_session(http, url, max_generated_tokens=full + 2)
    first = chat(http, url, key).json()
    assert first["usage"]["completion_tokens"] == full
    second = chat(http, url, key).json()  # only 2 tokens left: the answer is cut there
    assert second["usage"]["completion_tokens"] == 2
    assert second["choices"][0]["finish_reason"] == "length"
    err = assert_error_shape(chat(http, url, key), 429)
    assert err["code"] == "quota_exceeded" and err["param"] == "quotas.max_generated_tokens"
    q = quotas_of(http, url, sid)
    assert q["generated_tokens"] == full + 2 == q["max_generated_tokens"]


def test_max_concurrent_requests(gateway_factory, http) -> None:
    gw = gateway_factory(delay_s=1.0)  # each answer takes a second
    url = gw.url
    sid, key = new_session(http, url, max_concurrent_requests=1)
    results: list[int] = []
    slow = threading.Thread(target=lambda: results.append(chat(http, url, key).status_code))
    slow.start()
    deadline = 50
    while quotas_of(http, url, sid)["concurrent_requests"] == 0 and deadline:
        time.sleep(0.05)
        deadline -= 1
    assert quotas_of(http, url, sid)["concurrent_requests"] == 1
    r = chat(http, url, key)
    err = assert_error_shape(r, 429)
    assert err["code"] == "quota_exceeded" and err["param"] == "quotas.max_concurrent_requests"
    assert r.headers["retry-after"] == "1" and r.headers["x-should-retry"] == "true"
    slow.join()
    assert results == [200]
    assert chat(http, url, key).status_code == 200  # the slot is free again
    assert quotas_of(http, url, sid)["concurrent_requests"] == 0


def test_quotas_are_counted_from_the_shared_database(gateway_factory, http, tmp_path) -> None:
    """Two replicas on one database: requests made through one count on the other."""
    db = str(tmp_path / "shared.db")
    one, two = gateway_factory({"database": db}), gateway_factory({"database": db})
    sid, key = new_session(http, one.url, max_requests=2)
    assert chat(http, one.url, key).status_code == 200
    assert chat(http, two.url, key).status_code == 200
    assert assert_error_shape(chat(http, one.url, key), 429)["code"] == "quota_exceeded"
    assert assert_error_shape(chat(http, two.url, key), 429)["code"] == "quota_exceeded"
    assert quotas_of(http, two.url, sid)["requests"] == 2


def test_no_quotas_by_default(fake_gateway, http) -> None:
    url = fake_gateway.url
    r = http.post(f"{url}/sessions", headers=admin_headers(), json={})
    assert r.json()["quotas"] == {
        "max_requests": None,
        "max_generated_tokens": None,
        "max_concurrent_requests": None,
        "requests": 0,
        "generated_tokens": 0,
        "concurrent_requests": 0,
    }
    key = r.json()["api_key"]
    assert all(chat(http, url, key).status_code == 200 for _ in range(3))


def test_bad_quotas_are_400(fake_gateway, http) -> None:
    url = fake_gateway.url
    for quotas in ({"max_requests": 0}, {"max_generated_tokens": -1}, {"per_hour": 3}):
        r = http.post(f"{url}/sessions", headers=admin_headers(), json={"quotas": quotas})
        assert assert_error_shape(r, 400)["param"].startswith("quotas")


def test_a_burst_never_exceeds_max_requests(gateway_factory, http) -> None:
    """Eight requests at once on a session allowed three: exactly three are served."""
    gw = gateway_factory(delay_s=0.2)
    sid, key = new_session(http, gw.url, max_requests=3)
    statuses: list[int] = []
    threads = [
        threading.Thread(target=lambda: statuses.append(chat(http, gw.url, key).status_code))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200] * 3 + [429] * 5
    assert quotas_of(http, gw.url, sid)["requests"] == 3
