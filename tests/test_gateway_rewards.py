"""Rewards: idempotent upsert by completion id, several at once, bad values rejected."""

from __future__ import annotations

import json

import pytest
from gateway_helpers import admin_headers, assert_error_shape, bearer, read_session

pytestmark = pytest.mark.both_stores

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture
def session(fake_gateway, new_session, http):
    """A session with three recorded completions: (gateway, session_id, key, [ids])."""
    session_id, key = new_session(fake_gateway)
    ids = []
    for i in range(3):
        r = http.post(
            f"{fake_gateway.url}/chat/completions",
            headers=bearer(key),
            json={"messages": [{"role": "user", "content": f"question {i}"}]},
        )
        assert r.status_code == 200
        ids.append(r.json()["id"])
    return fake_gateway, session_id, key, ids


def rewards_of(gateway, session_id):
    return {c["id"]: c["reward"] for c in read_session(gateway, session_id)["completions"]}


def post_reward(http, gateway, key, body):
    return http.post(f"{gateway.url}/rewards", headers=bearer(key), json=body)


def test_reward_is_set_and_read_back(session, http):
    gw, sid, key, ids = session
    r = post_reward(http, gw, key, {"completion_id": ids[0], "reward": 0.75})
    assert r.status_code == 200
    assert r.json()["data"] == [{"completion_id": ids[0], "reward": 0.75}]
    assert rewards_of(gw, sid) == {ids[0]: 0.75, ids[1]: None, ids[2]: None}
    stats = read_session(gw, sid)["stats"]
    assert stats["num_rewarded"] == 1 and stats["num_completions"] == 3


def test_reward_upsert_is_idempotent_and_replaceable(session, http):
    gw, sid, key, ids = session
    for _ in range(2):
        assert (
            post_reward(http, gw, key, {"completion_id": ids[0], "reward": 0.5}).status_code == 200
        )
        assert rewards_of(gw, sid)[ids[0]] == 0.5
    assert post_reward(http, gw, key, {"completion_id": ids[0], "reward": -1.25}).status_code == 200
    assert rewards_of(gw, sid)[ids[0]] == -1.25
    assert read_session(gw, sid)["stats"]["num_rewarded"] == 1


@pytest.mark.parametrize(
    "value,stored", [(1, 1.0), (0, 0.0), (True, 1.0), (False, 0.0), (-3, -3.0)]
)
def test_int_and_bool_rewards_are_stored_as_float(session, http, value, stored):
    gw, sid, key, ids = session
    r = post_reward(http, gw, key, {"completion_id": ids[1], "reward": value})
    assert r.status_code == 200
    got = rewards_of(gw, sid)[ids[1]]
    assert isinstance(got, float) and got == stored


def test_several_rewards_in_one_call(session, http):
    gw, sid, key, ids = session
    r = post_reward(http, gw, key, {"rewards": {ids[0]: 1, ids[2]: 0.25}})
    assert r.status_code == 200
    assert {d["completion_id"]: d["reward"] for d in r.json()["data"]} == {
        ids[0]: 1.0,
        ids[2]: 0.25,
    }
    assert rewards_of(gw, sid) == {ids[0]: 1.0, ids[1]: None, ids[2]: 0.25}


def test_admin_may_reward_any_session(session, http):
    gw, sid, _, ids = session
    r = http.post(
        f"{gw.url}/rewards", headers=admin_headers(), json={"completion_id": ids[2], "reward": 2}
    )
    assert r.status_code == 200
    assert rewards_of(gw, sid)[ids[2]] == 2.0


def test_put_completion_reward(session, http):
    gw, sid, key, ids = session
    url = f"{gw.url}/completions/{ids[1]}/reward"
    assert http.put(url, headers=bearer(key), json={"reward": 0.3}).status_code == 200
    assert rewards_of(gw, sid)[ids[1]] == pytest.approx(0.3)
    assert http.put(url, headers=bearer(key), json={"reward": True}).status_code == 200
    assert rewards_of(gw, sid)[ids[1]] == 1.0
    r = http.put(
        f"{gw.url}/completions/chatcmpl-nope/reward", headers=bearer(key), json={"reward": 1}
    )
    assert assert_error_shape(r, 404)["code"] == "completion_not_found"


@pytest.mark.parametrize(
    "raw",
    [
        '{"completion_id": "%s", "reward": NaN}',
        '{"completion_id": "%s", "reward": Infinity}',
        '{"completion_id": "%s", "reward": -Infinity}',
        '{"completion_id": "%s", "reward": 1e999}',
        '{"completion_id": "%s", "reward": 1' + "0" * 400 + "}",
        '{"completion_id": "%s", "reward": "high"}',
        '{"completion_id": "%s", "reward": "0.5"}',
        '{"completion_id": "%s", "reward": [1]}',
        '{"completion_id": "%s", "reward": null}',
        '{"completion_id": "%s"}',
        '{"rewards": {"%s": NaN}}',
        '{"rewards": {"%s": "1"}}',
        '{"rewards": {}}',
        "{}",
    ],
    ids=[
        "nan",
        "inf",
        "-inf",
        "overflow-float",
        "huge-int",
        "string",
        "numeric-string",
        "list",
        "null",
        "missing",
        "nan-in-map",
        "string-in-map",
        "empty-map",
        "empty-body",
    ],
)
def test_bad_reward_is_400_and_nothing_changes(session, http, raw):
    gw, sid, key, ids = session
    body = raw % ids[0] if "%s" in raw else raw
    r = http.post(
        f"{gw.url}/rewards",
        headers={**bearer(key), "content-type": "application/json"},
        content=body.encode(),
    )
    assert_error_shape(r, 400)
    assert rewards_of(gw, sid)[ids[0]] is None
    # The gateway still serves: rewards and completions both work after a rejected one.
    assert post_reward(http, gw, key, {"completion_id": ids[0], "reward": 1}).status_code == 200
    assert rewards_of(gw, sid)[ids[0]] == 1.0
    r = http.post(f"{gw.url}/chat/completions", headers=bearer(key), json={"messages": MESSAGES})
    assert r.status_code == 200


def test_bad_value_in_map_rejects_the_whole_map(session, http):
    gw, sid, key, ids = session
    r = http.post(
        f"{gw.url}/rewards",
        headers={**bearer(key), "content-type": "application/json"},
        content=json.dumps({"rewards": {ids[0]: 1.0, ids[1]: float("nan")}}).encode(),
    )
    assert_error_shape(r, 400)
    assert rewards_of(gw, sid) == {ids[0]: None, ids[1]: None, ids[2]: None}


def test_unknown_completion_is_404_and_rejects_the_whole_map(session, http):
    gw, sid, key, ids = session
    err = assert_error_shape(
        post_reward(http, gw, key, {"completion_id": "chatcmpl-unknown", "reward": 1.0}), 404
    )
    assert err["code"] == "completion_not_found"
    r = post_reward(http, gw, key, {"rewards": {ids[0]: 1.0, "chatcmpl-unknown": 0.0}})
    assert_error_shape(r, 404)
    assert rewards_of(gw, sid)[ids[0]] is None


def test_reward_needs_a_key(session, http):
    gw, sid, _, ids = session
    r = http.post(f"{gw.url}/rewards", json={"completion_id": ids[0], "reward": 1.0})
    assert_error_shape(r, 401)
    assert rewards_of(gw, sid)[ids[0]] is None


def test_rewards_show_up_in_export(session, http):
    gw, sid, key, ids = session
    url = f"{gw.url}/sessions/{sid}/export"
    # No reward at all yet: exporting would silently train on zeros, so it is refused.
    assert assert_error_shape(http.get(url, headers=bearer(key)), 409)["code"] == "no_reward"

    wanted = {ids[0]: 1.0, ids[1]: 0.0, ids[2]: -0.5}
    assert post_reward(http, gw, key, {"rewards": wanted}).status_code == 200
    r = http.get(url, headers=bearer(key))
    assert r.status_code == 200
    samples = {s["completion_ids"][0]: s for s in r.json()["samples"]}
    assert set(samples) == set(ids)
    for cid, reward in wanted.items():
        s = samples[cid]
        assert s["reward"] == reward
        assert s["returns"] == reward  # three unrelated conversations: no later turns
        assert len(s["input_ids"]) == len(s["loss_mask"]) == len(s["logprobs"])
        assert sum(s["loss_mask"]) > 0 and s["loss_mask"][0] == 0
