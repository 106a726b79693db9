"""/metrics through prometheus-client: request latency by route and status, tokens in
and out, drift and parse-failure counts, store commit latency, engine queue depth and
active sessions, in a format Prometheus' own parser reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway_helpers import FAKE_REPLY, WEATHER, admin_headers, bearer, http_client
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def scrape(gw) -> dict[tuple[str, tuple], float]:
    with http_client() as http:
        r = http.get(f"{gw.url.removesuffix('/v1')}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def chat(http, gw, key: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    r = http.post(
        f"{gw.url}/chat/completions",
        headers=bearer(key),
        json={"model": "default", "messages": messages, **extra},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_metrics_cover_requests_tokens_drift_store_and_sessions(fake_gateway, new_session):
    gw = fake_gateway
    sid, key = new_session(gw)
    gw.engine.script(
        FAKE_REPLY, FAKE_REPLY, '<tool_call>\n{"name": "get_weather", oops}\n</tool_call>'
    )
    with http_client() as http:
        first = chat(http, gw, key, QUESTION)
        answer = first["choices"][0]["message"]
        # the same message to the gateway, other tokens to the model: a whitespace drift
        drifted = [*QUESTION, {**answer, "content": "\n\n" + answer["content"]}]
        second = chat(http, gw, key, [*drifted, {"role": "user", "content": "Sure?"}])
        third = chat(http, gw, key, QUESTION, tools=[WEATHER])  # a call that does not parse
        assert http.get(f"{gw.url}/sessions/nope", headers=admin_headers()).status_code == 404
        assert http.get(f"{gw.url}/models", headers=bearer("tsk-wrong")).status_code == 401
        m = scrape(gw)
        usage = [first["usage"], second["usage"], third["usage"]]
        assert m[("turnstile_prompt_tokens_total", ())] == sum(u["prompt_tokens"] for u in usage)
        assert m[("turnstile_completion_tokens_total", ())] == sum(
            u["completion_tokens"] for u in usage
        )
        assert m[("turnstile_prompt_drift_total", ())] == 1
        assert m[("turnstile_prompt_drift_whitespace_total", ())] == 1
        assert m[("turnstile_tool_call_parse_failures_total", ())] == 1
        chat_200 = (("endpoint", "/v1/chat/completions"), ("method", "POST"), ("status", "200"))
        assert m[("turnstile_http_request_seconds_count", chat_200)] == 3
        assert m[("turnstile_http_request_seconds_bucket", tuple(sorted((*chat_200, ("le", "+Inf")))))] == 3  # fmt: skip
        not_found = (("endpoint", "/v1/sessions/{session_id}"), ("method", "GET"), ("status", "404"))  # fmt: skip
        assert m[("turnstile_http_request_seconds_count", not_found)] == 1
        assert m[("turnstile_http_request_seconds_count", (("endpoint", "/v1/models"), ("method", "GET"), ("status", "401")))] == 1  # fmt: skip
        assert m[("turnstile_store_commit_seconds_count", ())] >= 1
        assert m[("turnstile_records_committed", ())] == 3
        assert m[("turnstile_engine_queue_depth", ())] == 0
        assert m[("turnstile_sessions_active", ())] == 1
        r = http.post(f"{gw.url}/sessions/{sid}/end", headers=admin_headers())
        assert r.status_code == 200
    assert scrape(gw)[("turnstile_sessions_active", ())] == 0


def test_unknown_paths_share_one_label(fake_gateway):
    with http_client() as http:
        for i in range(3):
            http.get(f"{fake_gateway.url.removesuffix('/v1')}/no/such/{i}")
    m = scrape(fake_gateway)
    unmatched = [k for k in m if k[0] == "turnstile_http_request_seconds_count"
                 and ("endpoint", "unmatched") in k[1]]  # fmt: skip
    assert len(unmatched) == 1 and m[unmatched[0]] == 3


def test_grafana_dashboard_queries_only_exported_metrics(fake_gateway, new_session):
    """deploy/grafana/turnstile-gateway.json charts series this gateway really serves
    (at 0 before any traffic where they are counters), under their exported names."""
    import json
    import re

    dashboard = json.loads((REPO / "deploy/grafana/turnstile-gateway.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {m for e in exprs for m in re.findall(r"turnstile_[a-z_]+", e)}
    _, key = new_session(fake_gateway)
    with http_client() as http:
        chat(http, fake_gateway, key, QUESTION)
    exported = {name for name, _ in scrape(fake_gateway)}
    assert len(queried) >= 12 and queried <= exported, queried - exported
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])
