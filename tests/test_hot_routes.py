"""The generating routes are answered by a pure ASGI middleware before FastAPI's router
(gateway/entrypoints/hot_routes.py), and what a client sees is what FastAPI's path gave:
the answer, the statuses, both APIs' error shapes, the request timer's route label, and
the other routes as before. The app is a plain FastAPI app: nothing overrides it."""

from __future__ import annotations

import collections

from fastapi import FastAPI
from gateway_helpers import FAKE_REPLY, assert_error_shape, bearer, http_client
from starlette.routing import Router
from test_metrics import scrape

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def test_generating_routes_skip_the_router_and_keep_their_answers_and_errors(
    fake_gateway, new_session, monkeypatch
):
    gw = fake_gateway
    _, key = new_session(gw)
    routed: collections.Counter[str] = collections.Counter()
    original = Router.__call__

    async def counting(self, scope, receive, send):  # type: ignore[no-untyped-def]
        routed[scope.get("path", "")] += 1
        await original(self, scope, receive, send)

    monkeypatch.setattr(Router, "__call__", counting)
    gw.engine.script(FAKE_REPLY, FAKE_REPLY)
    with http_client() as http:
        ok = http.post(
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={"model": "default", "messages": QUESTION},
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["message"]["content"] == FAKE_REPLY
        assert ok.headers["content-type"] == "application/json"

        # a body that is not JSON: OpenAI's 400; a wrong key: 401
        bad = http.post(
            f"{gw.url}/chat/completions",
            headers={**bearer(key), "content-type": "application/json"},
            content=b"{not json",
        )
        assert assert_error_shape(bad, 400)["message"] == "Request body is not valid JSON."
        assert_error_shape(
            http.post(f"{gw.url}/completions", headers=bearer("tsk-wrong"), json={}), 401
        )
        # the Anthropic route answers in its own shape
        anthropic = http.post(f"{gw.url}/messages", headers=bearer(key), json={"model": "x"})
        assert anthropic.status_code == 400
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "invalid_request_error"

        # what is not a POST to a generating route still goes through FastAPI
        assert http.get(f"{gw.url}/chat/completions").status_code == 405
        assert http.get(f"{gw.url}/models", headers=bearer(key)).status_code == 200
        m = scrape(gw)

    assert type(gw.app) is FastAPI
    hot = {"/v1/chat/completions", "/v1/completions", "/v1/messages"}
    assert not hot & {p for p, n in routed.items() if n and p != "/v1/chat/completions"}
    assert routed["/v1/chat/completions"] == 1  # the GET only
    assert routed["/v1/models"] == 1
    label = (("endpoint", "/v1/chat/completions"), ("method", "POST"))
    assert m[("turnstile_http_request_seconds_count", (*label, ("status", "200")))] == 1
    assert m[("turnstile_http_request_seconds_count", (*label, ("status", "400")))] == 1
