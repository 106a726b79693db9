"""schemathesis over every route of the OpenAPI document, in-process, fake engine.

For each route and each kind of caller (a live session's key, the admin key, no key),
schemathesis generates valid and invalid requests from the document and checks every
answer: no 5xx, a declared status, a declared content type, and a body (or each
streamed event) that matches the declared schema. Every route is in the document: the
OpenAI and Anthropic (`/v1/messages`) APIs, sessions and rewards, and the viewer's
HTML pages (`/ui`, with the admin key as a header, `?key=` or cookie). A fourth caller
is a client locked out for offering invalid keys (gateway/auth_limits.py), holding a
live session's key: every route that takes a key answers its declared 429. Cases are
derandomized, so a run is reproducible. A bench run with more cases
(docs/reliability.md):

    TURNSTILE_FUZZ_EXAMPLES=400 pytest -q -s tests/test_fuzz_api.py
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from gateway_helpers import ADMIN_KEY, FAKE_REPLY, admin_headers, bearer
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import gateway.app
from gateway.auth_limits import AuthLimiter
from gateway.config import GatewayConfig
from gateway.inference.fake import FakeEngine

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
BASE = f"http://{asgi.HOST}"
# cases per (route, key), split over its strategies; routes with few inputs have fewer.
# 80 gives ~4,200 cases over the three keys in `make test`; the bench run sets more.
EXAMPLES = int(os.environ.get("TURNSTILE_FUZZ_EXAMPLES", "80"))
MIN_CASES_PER_KEY = int(EXAMPLES * 8.4)  # 672 x 3 keys >= 2,000 at the default
# the locked-out client: only the 429s' shape is new there, so fewer cases per route
LOCKED_EXAMPLES = max(4, EXAMPLES // 8)


@pytest.fixture
def app(tmp_path, tokenizer, monkeypatch) -> Iterator[Any]:
    """The gateway app with an instant engine; its lifespan is run by schemathesis."""
    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
    engine = FakeEngine(
        reply_ids=tokenizer.encode(FAKE_REPLY, add_special_tokens=False),
        stop_id=int(tokenizer.eos_token_id),
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
    )
    run = tmp_path / "run"  # a training run folder, for the viewer's run pages
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    config = GatewayConfig(
        database=str(tmp_path / "fuzz.db"),
        admin_key=ADMIN_KEY,
        engine="fake",
        auth_failure_limit=0,  # the fuzzer's wrong keys (/ui) must not lock it out
        run_dirs=[str(run)],
    )
    application = gateway.app.create_app(config, engine=engine)
    yield application
    asgi.shutdown_lifespans()


@pytest.fixture
def schema(app) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@dataclass
class Tally:
    cases: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    by_route: dict[str, set[int]] = field(default_factory=dict)


def live_session(app) -> tuple[str, str, str]:
    """A session with one recorded, rewarded completion: (session id, key, completion id)."""
    with asgi.get_client(app) as client:
        r = client.post(f"{BASE}/v1/sessions", headers=admin_headers(), json={})
        sid, key = r.json()["id"], r.json()["api_key"]
        r = client.post(
            f"{BASE}/v1/chat/completions",
            headers=bearer(key),
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        cid = r.json()["id"]
        client.post(
            f"{BASE}/v1/rewards", headers=bearer(key), json={"completion_id": cid, "reward": 1}
        )
    return sid, key, cid


def fuzz(
    strategy: Any, client: Any, headers: dict[str, str], tally: Tally, label: str, n: int
) -> None:
    """Up to `n` cases from `strategy` (fewer where it has fewer), each sent and checked."""

    @given(case=strategy)
    @settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        tally.cases += 1
        try:
            response = case.call_and_validate(session=client, headers=headers, checks=CHECKS)
        except (Exception, FailureGroup) as exc:  # report every failing route
            tally.failures.append(f"{label}: {exc}"[:3000])
            return
        tally.statuses[response.status_code] = tally.statuses.get(response.status_code, 0) + 1
        tally.by_route.setdefault(label, set()).add(response.status_code)

    try:
        run()
    except Unsatisfiable:
        pass  # nothing to generate here (e.g. an invalid request to a route without input)


def lock_out(app) -> tuple[str, str, str]:
    """Lock the fuzzer's client out (three invalid keys), after making it a live
    session, whose key it then offers in vain."""
    live = live_session(app)
    app.state.gateway.keys.limiter = AuthLimiter(3, 60.0, 3600.0)
    with asgi.get_client(app) as client:
        for _ in range(3):
            r = client.get(f"{BASE}/v1/models", headers=bearer("tsk-invalid"))
            assert r.status_code == 401, r.text
        assert client.get(f"{BASE}/v1/models", headers=bearer(live[1])).status_code == 429
    return live


@pytest.mark.slow
@pytest.mark.parametrize("who", ["session", "admin", "none", "locked"])
def test_fuzz_every_route(app, schema, who) -> None:
    """Every route, with a live session's key, the admin key, or no key: no 5xx, and
    every answer's status, content type and body are the ones the document declares.
    `locked`: a locked-out client with a live session's key: the same checks, and no
    route that takes a key serves it."""
    tally = Tally()
    per_route: dict[str, int] = {}
    examples = LOCKED_EXAMPLES if who == "locked" else EXAMPLES
    locked = lock_out(app) if who == "locked" else None
    keyed: set[str] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        if "401" in operation.definition.raw.get("responses", {}):
            keyed.add(operation.label)
        # a fresh session each time: a case may end it (a locked client cannot make one)
        sid, key, cid = locked or live_session(app)
        headers = {
            "session": bearer(key),
            "admin": admin_headers(),
            "none": {},
            "locked": bearer(key),
        }[who]
        strategies = [
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),
        ]
        known = (("session_id", sid), ("completion_id", cid), ("index", 0))
        own = {k: v for k, v in known if "{" + k + "}" in operation.path}
        if own:  # ids that exist, so that the 200s of these routes are reached too
            strategies.append(operation.as_strategy(GenerationMode.POSITIVE, path_parameters=own))
        before = tally.cases
        with asgi.get_client(app) as client:
            for strategy in strategies:
                n = examples // len(strategies) + 1
                fuzz(strategy, client, headers, tally, operation.label, n)
        per_route[operation.label] = tally.cases - before
    print(f"\n{who}: {tally.cases} cases, statuses {dict(sorted(tally.statuses.items()))}")
    for label, statuses in sorted(tally.by_route.items()):
        print(f"  {label}: {per_route[label]} cases, statuses {sorted(statuses)}")
    assert not tally.failures, "\n\n".join(tally.failures[:10])
    assert all(per_route.values()), per_route  # every route was reached
    assert any(label.startswith("POST /v1/messages") for label in per_route)
    assert sum(label.startswith("GET /ui") for label in per_route) >= 6, per_route
    if who == "locked":
        served = {label for label in keyed if any(s < 300 for s in tally.by_route.get(label, ()))}
        assert not served, served  # every route that takes a key refused it
        assert tally.statuses.get(429), tally.statuses
    else:
        assert tally.cases >= MIN_CASES_PER_KEY, per_route


# ---- what the fuzzer found, kept as plain tests ------------------------------------
def test_huge_offset_is_400(fake_gateway, http) -> None:
    r = http.get(f"{fake_gateway.url}/sessions?offset={2**66}", headers=admin_headers())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "query.offset"


def test_integers_beyond_64_bits_are_recorded_exactly(fake_gateway, http, new_session) -> None:
    """A client's own field may hold any JSON integer; its record must still commit."""
    sid, key = new_session(fake_gateway)
    big = 2**70 + 1
    tool = {
        "type": "function",
        "function": {
            "name": "count",
            "parameters": {"type": "object", "properties": {"n": {"maximum": big}}},
        },
    }  # tools are hashed (to link turns) as well as stored
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "x_trace": [big, -big],
        "tools": [tool],
    }
    r = http.post(f"{fake_gateway.url}/chat/completions", headers=bearer(key), json=body)
    assert r.status_code == 200, r.text
    stored = http.get(f"{fake_gateway.url}/sessions/{sid}", headers=bearer(key)).json()
    assert stored["completions"][0]["request"]["x_trace"] == [big, -big]
    assert stored["completions"][0]["request"]["tools"] == [tool]


def test_seed_beyond_64_bits_is_400(fake_gateway, http, new_session) -> None:
    _, key = new_session(fake_gateway)
    body = {"messages": [{"role": "user", "content": "hi"}], "seed": 2**64}
    r = http.post(f"{fake_gateway.url}/chat/completions", headers=bearer(key), json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
