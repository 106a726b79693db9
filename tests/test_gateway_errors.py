"""Errors: always OpenAI's JSON shape with the right status, never a stack trace."""

from __future__ import annotations

import json
import re
from http.client import HTTPConnection
from urllib.parse import urlsplit

import openai
import pytest
from gateway_helpers import FAKE_REPLY, admin_headers, assert_error_shape, bearer, openai_client

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture
def key(fake_gateway, new_session):
    return new_session(fake_gateway)[1]


def post_chat(http, gateway, key, **kwargs):
    return http.post(f"{gateway.url}/chat/completions", headers=bearer(key), **kwargs)


@pytest.mark.parametrize(
    "body", [b"{bad", b"", b"[1, 2", b'{"messages": [}'], ids=["brace", "empty", "list", "nested"]
)
def test_malformed_json_is_400(fake_gateway, key, http, body):
    r = http.post(
        f"{fake_gateway.url}/chat/completions",
        headers={**bearer(key), "content-type": "application/json"},
        content=body,
    )
    err = assert_error_shape(r, 400)
    assert err["type"] == "invalid_request_error"
    assert fake_gateway.engine.calls == []


def test_missing_messages_is_400_naming_messages(fake_gateway, key, http):
    err = assert_error_shape(post_chat(http, fake_gateway, key, json={"model": "default"}), 400)
    assert "messages" in (err["param"] or "")
    err = assert_error_shape(post_chat(http, fake_gateway, key, json={"messages": []}), 400)
    assert "messages" in (err["param"] or "")


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"messages": MESSAGES, "temperature": 5}, "temperature"),
    ],
    ids=["bad-role", "zero-max-tokens", "hot-temperature"],
)
def test_invalid_parameters_are_400_naming_the_param(fake_gateway, key, http, body, param):
    err = assert_error_shape(post_chat(http, fake_gateway, key, json=body), 400)
    assert param in (err["param"] or ""), err
    assert fake_gateway.engine.calls == []


def test_unknown_openai_fields_are_accepted(fake_gateway, key, http):
    extra = {
        "store": False,
        "metadata": {"run": "r1"},
        "user": "agent-7",
        "parallel_tool_calls": False,
        "frequency_penalty": 0.0,
        "service_tier": "auto",
    }
    r = post_chat(http, fake_gateway, key, json={"messages": MESSAGES, **extra})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == FAKE_REPLY

    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default",
        messages=MESSAGES,
        store=False,
        metadata={"run": "r1"},
        user="agent-7",
        parallel_tool_calls=False,
    )
    assert answer.choices[0].message.content == FAKE_REPLY


def test_prompt_longer_than_context_is_400(gateway_factory, new_session, http):
    gw = gateway_factory(max_context=64)
    _, key = new_session(gw)
    long = [{"role": "user", "content": "word " * 200}]
    err = assert_error_shape(post_chat(http, gw, key, json={"messages": long}), 400)
    assert err["code"] == "context_length_exceeded"
    assert "64" in err["message"]
    assert gw.engine.calls == []
    # A short prompt still fits, with max_tokens cut down to what is left of the context.
    r = post_chat(http, gw, key, json={"messages": MESSAGES, "max_tokens": 500})
    assert r.status_code == 200
    prompt_ids, params = gw.engine.calls[-1]
    assert len(prompt_ids) + params.max_new_tokens <= 64


def test_context_error_is_bad_request_in_openai_client(gateway_factory, new_session):
    gw = gateway_factory(max_context=64)
    _, key = new_session(gw)
    with pytest.raises(openai.BadRequestError) as info:
        openai_client(gw, key).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "word " * 200}]
        )
    assert info.value.code == "context_length_exceeded"


def test_dead_engine_is_503_then_recovers(fake_gateway, key, http):
    engine = fake_gateway.engine
    health = f"{fake_gateway.url.removesuffix('/v1')}/healthz"
    assert http.get(health).status_code == 200

    engine.alive = False
    err = assert_error_shape(post_chat(http, fake_gateway, key, json={"messages": MESSAGES}), 503)
    assert err["code"] == "engine_unavailable"
    r = http.get(health)
    assert r.status_code == 503 and r.json()["status"] == "engine_unavailable"

    engine.alive = True
    r = post_chat(http, fake_gateway, key, json={"messages": MESSAGES})
    assert r.status_code == 200
    assert http.get(health).status_code == 200
    # Only the answered request was recorded.
    listing = http.get(f"{fake_gateway.url}/sessions", headers=admin_headers()).json()
    assert listing["data"][0]["num_completions"] == 1


def test_engine_crash_is_500_without_traceback(gateway_factory, new_session, http, tokenizer):
    reply = tokenizer.encode(FAKE_REPLY, add_special_tokens=False)
    crash = {"next": True}

    def flaky(_prompt_ids):
        if crash["next"]:
            raise RuntimeError("boom in the engine")
        return reply

    gw = gateway_factory(reply_ids=flaky)
    _, key = new_session(gw)
    err = assert_error_shape(post_chat(http, gw, key, json={"messages": MESSAGES}), 500)
    assert err["type"] == "server_error"
    assert "Traceback" not in err["message"] and "File " not in err["message"]

    crash["next"] = False  # the gateway itself is unharmed
    r = post_chat(http, gw, key, json={"messages": MESSAGES})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == FAKE_REPLY


def test_keep_alive_connection_survives_a_500(gateway_factory, new_session, tokenizer):
    """Pooled clients (the trainer's shared httpx client) must not see a reset after a 500."""
    reply = tokenizer.encode(FAKE_REPLY, add_special_tokens=False)
    crash = {"next": True}

    def flaky(_prompt_ids):
        if crash.pop("next", False):
            raise RuntimeError("boom in the engine")
        return reply

    gw = gateway_factory(reply_ids=flaky)
    _, key = new_session(gw)
    parts = urlsplit(gw.url)
    conn = HTTPConnection(parts.hostname, parts.port, timeout=30)
    headers = {**bearer(key), "content-type": "application/json"}
    body = json.dumps({"messages": MESSAGES})
    try:
        statuses = []
        for _ in range(2):  # both on the one connection
            conn.request("POST", parts.path + "/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        conn.close()
    assert statuses == [500, 200]


def test_unknown_route_is_404_in_error_shape(fake_gateway, key, http):
    assert_error_shape(http.get(f"{fake_gateway.url}/nope", headers=bearer(key)), 404)
    r = http.get(f"{fake_gateway.url}/chat/completions", headers=bearer(key))
    assert_error_shape(r, 405)


def test_healthz_reports_engine(fake_gateway, http):
    r = http.get(f"{fake_gateway.url.removesuffix('/v1')}/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "engine": "fake", "policy_version": 0}


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_metrics_count_completions_and_tokens(fake_gateway, key, http, tokenizer):
    url = f"{fake_gateway.url.removesuffix('/v1')}/metrics"
    r = post_chat(http, fake_gateway, key, json={"messages": MESSAGES})
    assert r.status_code == 200
    usage = r.json()["usage"]
    cid = r.json()["id"]
    reward = http.post(
        f"{fake_gateway.url}/rewards", headers=bearer(key), json={"completion_id": cid, "reward": 1}
    )
    assert reward.status_code == 200

    m = http.get(url)
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    text = m.text
    assert metric(text, "turnstile_completions_total") == 1
    assert metric(text, "turnstile_prompt_tokens_total") == usage["prompt_tokens"]
    assert metric(text, "turnstile_completion_tokens_total") == usage["completion_tokens"]
    assert metric(text, "turnstile_rewards_total") == 1
    assert metric(text, "turnstile_records_committed") == 1
    assert metric(text, "turnstile_completion_seconds_count") == 1
    assert metric(text, "turnstile_sessions_created_total") == 1
