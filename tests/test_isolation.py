"""A session key reaches nothing outside its own session, on every route.

The routes come from the app's own route table (gateway.app.ROUTERS), so a new route is
tested the moment it is added: it must say in PROBES how to aim it at another session
(or that it takes no input), or `test_every_route_has_a_probe` fails.

For each route, session A's key is aimed at session B (B's ids in the path, the body
referring to B's completions, conversation and responses). The answer must be exactly
the one an id that does not exist gets (no existence leak), must hold nothing of B's
(ids, key, prompt text), and B must be unchanged afterwards.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from gateway_helpers import admin_headers, bearer

import gateway.app

ROUTES = sorted(
    (method, route.path)
    for module in gateway.app.ROUTERS
    for route in module.router.routes
    if isinstance(route, APIRoute)
    for method in route.methods
)
# those the OpenAPI document lists
DOCUMENTED = {
    (method, route.path)
    for module in gateway.app.ROUTERS
    for route in module.router.routes
    if isinstance(route, APIRoute) and route.include_in_schema
    for method in route.methods
}
SECRET = "zebra quartz marmalade"  # in B's prompts only


@dataclass
class Target:
    """What session A aims at: B's session, its chat turn and its response."""

    session_id: str
    completion_id: str
    response_id: str
    messages: list[dict[str, Any]]


Probe = Callable[[Target], dict[str, Any] | None]
# The body each route gets, aimed at the target (None: no body).
PROBES: dict[tuple[str, str], Probe] = {
    ("POST", "/v1/chat/completions"): lambda t: {
        "model": "m",  # B's whole conversation: it must not link to B's turn
        "messages": [*t.messages, {"role": "user", "content": "and then?"}],
    },
    ("POST", "/v1/completions"): lambda t: {"model": "m", "prompt": SECRET, "max_tokens": 4},
    ("POST", "/v1/responses"): lambda t: {
        "model": "m",
        "input": "go on",
        "previous_response_id": t.response_id,
    },
    ("GET", "/v1/models"): lambda t: None,
    ("POST", "/v1/sessions"): lambda t: {},
    ("GET", "/v1/sessions"): lambda t: None,
    ("GET", "/v1/sessions/{session_id}"): lambda t: None,
    ("POST", "/v1/sessions/{session_id}/end"): lambda t: None,
    ("GET", "/v1/sessions/{session_id}/export"): lambda t: None,
    ("POST", "/v1/rewards"): lambda t: {"completion_id": t.completion_id, "reward": 1.0},
    ("PUT", "/v1/completions/{completion_id}/reward"): lambda t: {"reward": 1.0},
    ("POST", "/v1/messages"): lambda t: {  # B's conversation, in Anthropic's shape
        "model": "m",
        "max_tokens": 4,
        "messages": [*t.messages, {"role": "user", "content": "and then?"}],
    },
    ("POST", "/v1/messages/count_tokens"): lambda t: {"model": "m", "messages": t.messages},
    # the viewer: admin pages; a session key gets the same refusal whatever it aims at
    ("GET", "/ui"): lambda t: None,
    ("GET", "/ui/sessions"): lambda t: None,
    ("GET", "/ui/sessions/{session_id}"): lambda t: None,
    ("GET", "/ui/runs"): lambda t: None,
    ("GET", "/ui/runs/{index}"): lambda t: None,
    ("GET", "/ui/runs/{index}/metrics.json"): lambda t: None,
    ("GET", "/ui/static/{name:path}"): lambda t: None,
    ("GET", "/healthz"): lambda t: None,
    ("GET", "/metrics"): lambda t: None,
    # weights (admin only): a session key is refused whatever the body
    ("GET", "/admin/weights"): lambda t: None,
    ("POST", "/admin/weights"): lambda t: {"version": 1, "path": "/nonexistent"},
    ("POST", "/admin/weights/group"): lambda t: {
        "group": {"host": "127.0.0.1", "port": 1, "world_size": 2},
        "first_rank": 1,
    },
    ("POST", "/admin/weights/push"): lambda t: {
        "version": 1,
        "group_id": "g",
        "manifest": {"tensors": []},
    },
    ("DELETE", "/admin/weights/group"): lambda t: None,
}


def test_every_route_has_a_probe() -> None:
    assert set(ROUTES) == set(PROBES), "add the new route to PROBES"


def test_route_table_is_the_apps(fake_gateway) -> None:
    """ROUTES holds every route the running app's OpenAPI document lists."""
    paths = fake_gateway.app.openapi()["paths"]
    served = {(m.upper(), p) for p, ops in paths.items() for m in ops}
    as_written = {(m, re.sub(r"\{(\w+):\w+\}", r"{\1}", p)) for m, p in DOCUMENTED}
    assert served == as_written and DOCUMENTED <= set(ROUTES)  # `{name:path}` is `{name}`


def make_target(http: httpx.Client, root: str) -> tuple[Target, str]:
    """Session B with a chat turn (with SECRET in it) and a response; and B's key."""
    r = http.post(f"{root}/v1/sessions", headers=admin_headers(), json={})
    sid, key = r.json()["id"], r.json()["api_key"]
    messages = [{"role": "user", "content": f"remember {SECRET}"}]
    chat = http.post(
        f"{root}/v1/chat/completions",
        headers=bearer(key),
        json={"model": "m", "messages": messages},
    ).json()
    answer = chat["choices"][0]["message"]
    resp = http.post(
        f"{root}/v1/responses", headers=bearer(key), json={"model": "m", "input": SECRET}
    ).json()
    target = Target(
        sid,
        chat["id"],
        resp["id"],
        [*messages, {"role": "assistant", "content": answer["content"]}],
    )
    return target, key


def snapshot(http: httpx.Client, root: str, session_id: str) -> dict[str, Any]:
    """B as the admin sees it: status and each completion's id, parent and reward."""
    body = http.get(f"{root}/v1/sessions/{session_id}", headers=admin_headers()).json()
    return {
        "status": body["status"],
        "completions": [(c["id"], c["parent_id"], c["reward"]) for c in body["completions"]],
    }


def call(
    http: httpx.Client, root: str, method: str, path: str, key: str, target: Target
) -> httpx.Response:
    url = root + path.replace("{name:path}", "ui.css").format(
        session_id=target.session_id, completion_id=target.completion_id, index=0
    )
    body = PROBES[(method, path)](target)
    return http.request(method, url, headers=bearer(key), json=body)


def masked(text: str, target: Target) -> str:
    """The answer with the target's ids blanked: what must not differ between targets."""
    for value in (target.session_id, target.completion_id, target.response_id):
        text = text.replace(value, "<id>")
    return re.sub(r"(chatcmpl|cmpl|resp|msg|sess|toolu)[-_][0-9a-f_-]+", "<new-id>", text)


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_session_key_reaches_nothing_outside_its_session(
    fake_gateway, http, method: str, path: str
) -> None:
    root = fake_gateway.url.removesuffix("/v1")
    target, target_key = make_target(http, root)
    r = http.post(f"{root}/v1/sessions", headers=admin_headers(), json={})
    own_id, own_key = r.json()["id"], r.json()["api_key"]
    # ids that exist nowhere, in the same shapes as the target's
    ghost = Target("sess-" + "0" * 32, "chatcmpl-" + "0" * 32, "resp_" + "0" * 32, target.messages)
    before = snapshot(http, root, target.session_id)

    aimed = call(http, root, method, path, own_key, target)
    nowhere = call(http, root, method, path, own_key, ghost)

    # the same answer as for ids that do not exist: nothing tells B exists
    assert aimed.status_code == nowhere.status_code, (aimed.text, nowhere.text)
    if aimed.status_code >= 400:
        assert masked(aimed.text, target) == masked(nowhere.text, ghost)
    else:
        for leaked in (target.session_id, target.completion_id, target.response_id):
            assert leaked not in aimed.text
    assert SECRET not in aimed.text and target_key not in aimed.text
    # B untouched: not ended, not rewarded, no turn of A's linked under it
    assert snapshot(http, root, target.session_id) == before
    own = http.get(f"{root}/v1/sessions/{own_id}", headers=admin_headers()).json()
    b_ids = {cid for cid, _, _ in before["completions"]}
    assert all(c["parent_id"] not in b_ids for c in own["completions"])
    assert all(c["session_id"] == own_id for c in own["completions"])
