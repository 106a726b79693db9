"""Sessions and keys: creation, storage, expiry, ending, and isolation between sessions."""

from __future__ import annotations

import hashlib
import threading
import time

import openai
import pytest
import sqlalchemy as sa
from gateway_helpers import (
    FAKE_REPLY,
    admin_headers,
    assert_error_shape,
    bearer,
    openai_client,
    read_session,
    store_connection,
)

from gateway.config import GatewayConfig
from gateway.server import check_bind_allowed

pytestmark = pytest.mark.both_stores

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def chat(http, gateway, key, messages=MESSAGES, **extra):
    return http.post(
        f"{gateway.url}/chat/completions",
        headers=bearer(key),
        json={"model": "default", "messages": messages, **extra},
    )


# ---- lifecycle ---------------------------------------------------------------------------
def test_admin_creates_session_and_gets_key(fake_gateway, http):
    r = http.post(
        f"{fake_gateway.url}/sessions",
        headers=admin_headers(),
        json={"metadata": {"task": "math-1"}},
    )
    assert r.status_code == 201
    body = r.json()
    assert body["id"].startswith("sess-")
    assert body["api_key"].startswith("tsk-") and len(body["api_key"]) > 30
    assert body["status"] == "active"
    assert body["metadata"] == {"task": "math-1"}
    assert body["expires_at"] > time.time()


def test_two_sessions_get_different_keys(fake_gateway, new_session):
    (a, key_a), (b, key_b) = new_session(fake_gateway), new_session(fake_gateway)
    assert a != b and key_a != key_b


def test_session_key_is_stored_only_as_sha256(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    # A completion too, so every table holds something of this session.
    assert chat(http, fake_gateway, key).status_code == 200

    with store_connection(fake_gateway.config.database) as con:
        tables = sa.inspect(con).get_table_names()
        assert "sessions" in tables
        for table in tables:
            for row in con.execute(sa.text(f'SELECT * FROM "{table}"')):
                for value in row:
                    if isinstance(value, (bytes, memoryview)):
                        assert key.encode() not in bytes(value), f"plain key found in {table}"
                    else:
                        assert key not in str(value), f"plain key found in {table}"
        (key_hash,) = con.execute(
            sa.text("SELECT key_hash FROM sessions WHERE id = :id"), {"id": session_id}
        ).one()
    assert key_hash == hashlib.sha256(key.encode()).hexdigest()


def test_session_key_works_with_openai_client(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    assert [m.id for m in client.models.list().data] == ["default"]
    answer = client.chat.completions.create(model="default", messages=MESSAGES)
    assert answer.id.startswith("chatcmpl-")
    assert answer.choices[0].message.content == FAKE_REPLY
    assert answer.choices[0].finish_reason == "stop"


def test_key_works_as_x_api_key_header(fake_gateway, new_session, http):
    _, key = new_session(fake_gateway)
    r = http.get(f"{fake_gateway.url}/models", headers={"x-api-key": key})
    assert r.status_code == 200
    assert r.json()["data"][0]["id"] == "default"


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer tsk-not-a-real-key"},
        {"Authorization": "Bearer something-else"},
        {},
    ],
    ids=["wrong-session-key", "garbage-key", "no-key"],
)
def test_wrong_or_missing_key_is_401(fake_gateway, http, headers):
    for r in (
        http.get(f"{fake_gateway.url}/models", headers=headers),
        http.post(
            f"{fake_gateway.url}/chat/completions",
            headers=headers,
            json={"messages": MESSAGES},
        ),
    ):
        err = assert_error_shape(r, 401)
        assert err["type"] == "authentication_error"
        assert err["code"] == "invalid_api_key"


def test_wrong_key_raises_authentication_error_in_openai_client(fake_gateway):
    client = openai_client(fake_gateway, "tsk-wrong")
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="default", messages=MESSAGES)
    assert info.value.status_code == 401


def test_admin_key_is_not_a_session_key_for_openai_routes(fake_gateway, http):
    r = chat(http, fake_gateway, "admin-test")
    err = assert_error_shape(r, 401)
    assert err["code"] == "session_key_required"


def test_expired_session_key_is_401(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway, ttl_seconds=0.5)
    assert chat(http, fake_gateway, key).status_code == 200
    time.sleep(0.6)  # let the TTL pass
    err = assert_error_shape(chat(http, fake_gateway, key), 401)
    assert err["code"] == "invalid_api_key"  # as for a key that never existed
    assert read_status(http, fake_gateway, session_id) == "expired"


def read_status(http, gateway, session_id):
    r = http.get(f"{gateway.url}/sessions/{session_id}", headers=admin_headers())
    assert r.status_code == 200
    return r.json()["status"]


def test_ended_session_gives_410(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    first = chat(http, fake_gateway, key)
    assert first.status_code == 200

    r = http.post(f"{fake_gateway.url}/sessions/{session_id}/end", headers=bearer(key))
    assert r.status_code == 200
    assert r.json()["status"] == "ended" and r.json()["ended_at"] is not None

    err = assert_error_shape(chat(http, fake_gateway, key), 410)
    assert err["code"] == "session_ended"
    with pytest.raises(openai.APIStatusError) as info:
        openai_client(fake_gateway, key).chat.completions.create(model="default", messages=MESSAGES)
    assert info.value.status_code == 410

    # The record survives, and the agent may still read it back and reward it.
    view = http.get(f"{fake_gateway.url}/sessions/{session_id}", headers=bearer(key))
    assert view.status_code == 200
    assert [c["id"] for c in view.json()["completions"]] == [first.json()["id"]]
    rew = http.post(
        f"{fake_gateway.url}/rewards",
        headers=bearer(key),
        json={"completion_id": first.json()["id"], "reward": 1.0},
    )
    assert rew.status_code == 200


def test_ending_twice_keeps_first_end_time(fake_gateway, new_session, http):
    session_id, _ = new_session(fake_gateway)
    url = f"{fake_gateway.url}/sessions/{session_id}/end"
    first = http.post(url, headers=admin_headers()).json()["ended_at"]
    second = http.post(url, headers=admin_headers()).json()["ended_at"]
    assert first == second


def test_creating_session_needs_admin_key(fake_gateway, new_session, http):
    url = f"{fake_gateway.url}/sessions"
    assert_error_shape(http.post(url, json={}), (401, 403))
    assert_error_shape(http.post(url, headers=bearer("wrong-admin"), json={}), (401, 403))
    _, key = new_session(fake_gateway)
    err = assert_error_shape(http.post(url, headers=bearer(key), json={}), (401, 403))
    assert err["code"] in ("admin_key_required", "invalid_api_key")
    # Nothing was created by the refused calls.
    listing = http.get(url, headers=admin_headers()).json()["data"]
    assert len(listing) == 1


def test_listing_sessions_needs_admin_key(fake_gateway, new_session, http):
    _, key = new_session(fake_gateway)
    assert_error_shape(http.get(f"{fake_gateway.url}/sessions", headers=bearer(key)), 403)


def test_invalid_session_body_is_400(fake_gateway, http):
    r = http.post(f"{fake_gateway.url}/sessions", headers=admin_headers(), json={"ttl_seconds": -1})
    err = assert_error_shape(r, 400)
    assert "ttl_seconds" in (err["param"] or "")


# ---- isolation ---------------------------------------------------------------------------
def test_sessions_are_isolated(fake_gateway, new_session, http):
    a, key_a = new_session(fake_gateway)
    b, key_b = new_session(fake_gateway)
    comp_a = chat(http, fake_gateway, key_a).json()["id"]
    comp_b = chat(http, fake_gateway, key_b).json()["id"]
    url = fake_gateway.url

    # B cannot read, reward, export or end A, and is told A does not exist (404).
    err = assert_error_shape(http.get(f"{url}/sessions/{a}", headers=bearer(key_b)), 404)
    assert err["code"] == "session_not_found"
    r = http.post(
        f"{url}/rewards", headers=bearer(key_b), json={"completion_id": comp_a, "reward": 1.0}
    )
    assert_error_shape(r, 404)
    r = http.put(f"{url}/completions/{comp_a}/reward", headers=bearer(key_b), json={"reward": 1})
    assert_error_shape(r, 404)
    r = http.post(
        f"{url}/rewards", headers=bearer(key_b), json={"rewards": {comp_b: 1.0, comp_a: 1.0}}
    )
    assert_error_shape(r, 404)
    assert_error_shape(http.get(f"{url}/sessions/{a}/export", headers=bearer(key_b)), 404)
    assert_error_shape(http.post(f"{url}/sessions/{a}/end", headers=bearer(key_b)), 404)

    # Unknown ids answer exactly like other sessions' ids: no existence leak.
    unknown = http.get(f"{url}/sessions/sess-doesnotexist", headers=bearer(key_b))
    other = http.get(f"{url}/sessions/{a}", headers=bearer(key_b))
    assert unknown.status_code == other.status_code == 404

    # A is untouched: still active, its completion unrewarded.
    view_a = http.get(f"{url}/sessions/{a}", headers=bearer(key_a)).json()
    assert view_a["status"] == "active"
    assert [(c["id"], c["reward"]) for c in view_a["completions"]] == [(comp_a, None)]
    assert chat(http, fake_gateway, key_a).status_code == 200

    # B sees only its own completions.
    view_b = http.get(f"{url}/sessions/{b}", headers=bearer(key_b)).json()
    assert [c["id"] for c in view_b["completions"]] == [comp_b]

    # The admin reads both.
    for sid, cid in ((a, comp_a), (b, comp_b)):
        view = http.get(f"{url}/sessions/{sid}", headers=admin_headers())
        assert view.status_code == 200
        assert cid in [c["id"] for c in view.json()["completions"]]
    listed = {s["id"] for s in http.get(f"{url}/sessions", headers=admin_headers()).json()["data"]}
    assert {a, b} <= listed


# ---- bind policy -------------------------------------------------------------------------
def test_public_bind_without_admin_key_is_refused():
    with pytest.raises(SystemExit):
        check_bind_allowed(GatewayConfig(host="0.0.0.0", admin_key=None))
    with pytest.raises(SystemExit):
        check_bind_allowed(GatewayConfig(host="192.168.1.10", admin_key=""))


@pytest.mark.parametrize(
    "host,admin_key",
    [("0.0.0.0", "secret"), ("127.0.0.1", None), ("localhost", None), ("::1", None)],
)
def test_bind_allowed_with_admin_key_or_on_loopback(host, admin_key):
    check_bind_allowed(GatewayConfig(host=host, admin_key=admin_key))  # no SystemExit


def test_a_session_can_force_greedy_sampling(fake_gateway, http) -> None:
    """An evaluation session is greedy whatever temperature the (unchanged) agent asks for,
    and its records say what was really used."""
    r = http.post(
        f"{fake_gateway.url}/sessions",
        json={"sampling": {"temperature": 0.0}},
        headers=admin_headers(),
    )
    assert r.status_code == 201, r.text
    sid, key = r.json()["id"], r.json()["api_key"]
    assert r.json()["sampling"] == {"temperature": 0.0}
    r = http.post(
        f"{fake_gateway.url}/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "temperature": 1.5},
        headers=bearer(key),
    )
    assert r.status_code == 200, r.text
    _, params = fake_gateway.engine.calls[-1]
    assert params.temperature == 0.0
    [record] = read_session(fake_gateway, sid)["completions"]
    assert record["request"]["temperature"] == 0.0
    assert record["request"]["client_sampling"] == {"temperature": 1.5}
    bad = http.post(
        f"{fake_gateway.url}/sessions",
        json={"sampling": {"temperature": -1}},
        headers=admin_headers(),
    )
    assert_error_shape(bad, 400)


def test_a_session_ended_on_another_replica_stops_within_seconds(
    gateway_factory, new_session, http
):
    """Two gateways on one store: B has the key cached; ending the session through A
    stops it on B at B's next poll of ended sessions (every 2 s), not at a cache expiry."""
    a = gateway_factory()
    b = gateway_factory({"database": a.config.database})
    session_id, key = new_session(a)
    assert chat(http, b, key).status_code == 200  # B now holds the key in its cache
    assert http.post(f"{a.url}/sessions/{session_id}/end", headers=bearer(key)).status_code == 200
    ended = time.monotonic()
    while (status := chat(http, b, key).status_code) == 200:
        assert time.monotonic() - ended < 3.0, "B still serves an ended session after 3 s"
        time.sleep(0.2)
    assert status == 410


def test_key_lookups_and_the_ended_poll_leave_the_event_loop_free(
    gateway_factory, new_session, http
):
    """A key the cache misses and the poll for ended sessions are store queries: against
    a shared PostgreSQL, network round trips. Neither may run on the gateway's event
    loop, where every other request would wait for it."""
    a = gateway_factory()
    b = gateway_factory({"database": a.config.database})
    asked: list[tuple[str, threading.Thread]] = []
    repo = b.state.repo
    for name in ("session_by_key_hash", "sessions_ended_since"):
        real = getattr(repo, name)

        def spy(*args, _name=name, _real=real):
            asked.append((_name, threading.current_thread()))
            return _real(*args)

        setattr(repo, name, spy)
    _, key = new_session(a)  # created on A: B has never seen the key
    assert chat(http, b, key).status_code == 200
    deadline = time.monotonic() + 5.0
    while "sessions_ended_since" not in {n for n, _ in asked}:
        assert time.monotonic() < deadline, "B never polled the store for ended sessions"
        time.sleep(0.1)
    assert "session_by_key_hash" in {n for n, _ in asked}
    assert all(thread is not b._thread for _, thread in asked), asked
