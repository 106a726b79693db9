"""The viewer over plain HTTP (fast; the browser tests are in test_viewer.py): the
vendored chart library is the pinned npm release and nothing outside its folder is
served; the errors filter finds a session whose tool call did not parse; bad input is
a clear error page and the gateway keeps serving."""

from __future__ import annotations

import hashlib
import re

import httpx
from gateway_helpers import ADMIN_KEY, WEATHER, admin_headers, bearer, http_client

from gateway.ui.routes import STATIC

PINNED = {
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
}


def test_vendored_uplot_is_the_pinned_release():
    for name, digest in PINNED.items():
        assert hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest() == digest
    head = (STATIC / "vendor" / "uPlot.iife.min.js").read_text()[:200]
    assert re.search(r"uPlot", head)


def test_static_files_served_and_paths_confined(fake_gateway):
    base = fake_gateway.url.removesuffix("/v1")
    r = httpx.get(f"{base}/ui/static/vendor/uPlot.iife.min.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert hashlib.sha256(r.content).hexdigest() == PINNED["uPlot.iife.min.js"]
    for bad in ("../routes.py", "..%2Froutes.py", "vendor/../../routes.py", "nope.js"):
        assert httpx.get(f"{base}/ui/static/{bad}").status_code == 404


def test_errors_filter_and_bad_input(fake_gateway, new_session):
    base = fake_gateway.url.removesuffix("/v1") + "/ui"
    broken, key = new_session(fake_gateway, metadata={"agent": "a"})
    clean, _ = new_session(fake_gateway, metadata={"agent": "b"})
    fake_gateway.engine.script('<tool_call>\n{"name": "get_weather", oops}\n</tool_call>')
    with http_client() as http:
        r = http.post(
            f"{fake_gateway.url}/chat/completions",
            headers=bearer(key),
            json={"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                  "tools": [WEATHER]},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        page = http.get(f"{base}/sessions?errors=yes", headers=admin_headers()).text
        assert broken in page and clean not in page
        page = http.get(f"{base}/sessions?errors=no", headers=admin_headers()).text
        assert clean in page and broken not in page
        assert broken in http.get(f"{base}/sessions?meta=agent=a", headers=admin_headers()).text
        for url, status, says in [
            (
                f"/sessions/{broken}?turn_discount=2",
                400,
                "turn_discount must be a number in [0, 1]",
            ),
            (f"/sessions/{broken}?turn_discount=abc", 400, "turn_discount must be"),
            (f"/sessions/{broken}?style=nope", 400, "Unknown export style"),
            ("/sessions/sess-unknown", 404, "No session"),
            ("/sessions?meta=novalue", 400, "key=value"),
            ("/sessions?status=gone", 400, "status must be active, ended or expired"),
            ("/runs/7", 404, "No run 7"),
        ]:
            r = http.get(base + url, headers=admin_headers())
            assert r.status_code == status and says in r.text, (url, r.status_code, r.text[:300])
        r = http.get(f"{base}/sessions/{broken}", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "admin key" in r.text
        r = http.get(f"{base}/runs/0/metrics.json")
        assert r.status_code == 401
        assert http.get(f"{base}/sessions/{broken}", headers=admin_headers()).status_code == 200
    assert ADMIN_KEY not in page  # the key never lands in a page


def test_reasoning_shown_as_such(gateway_factory, new_session):
    """An answer with a <think> block: the page shows the reasoning apart, as parsed."""
    gw = gateway_factory(config={"reasoning_parser": "deepseek_r1"})
    sid, key = new_session(gw)
    gw.engine.script("Two and two make four.</think>It is 4.")
    with http_client() as http:
        r = http.post(
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={"model": "default", "messages": [{"role": "user", "content": "2+2?"}]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["reasoning_content"] == "Two and two make four."
        page = http.get(f"{gw.url.removesuffix('/v1')}/ui/sessions/{sid}", headers=admin_headers())
    assert (
        '<details class="reasoning" open><summary>reasoning</summary><pre>Two and two make four.</pre>'
        in page.text
    )


def test_sessions_list_is_paged(fake_gateway, new_session):
    from gateway.ui.routes import PAGE_SIZE

    made = {new_session(fake_gateway)[0] for _ in range(PAGE_SIZE + 1)}
    base = fake_gateway.url.removesuffix("/v1") + "/ui/sessions"
    with http_client() as http:
        first = http.get(f"{base}?status=active", headers=admin_headers()).text
        second = http.get(f"{base}?status=active&page=2", headers=admin_headers()).text
        assert http.get(f"{base}?page=0", headers=admin_headers()).status_code == 400
    rows = lambda html: set(re.findall(r'data-session="(sess-[0-9a-f]+)"', html))  # noqa: E731
    assert len(rows(first)) == PAGE_SIZE and len(rows(second)) == 1
    assert rows(first) | rows(second) == made
    assert 'href="/ui/sessions?status=active&amp;page=2" id="next"' in first
    assert 'id="prev"' in second and 'id="next"' not in second


def test_anthropic_tool_use_shown_as_a_call(fake_gateway, new_session):
    """A /v1/messages answer is recorded in Anthropic's shape; its tool_use block is
    listed as a tool call like a chat one."""
    from anthropic_helpers import BASH, post_messages

    sid, key = new_session(fake_gateway)
    fake_gateway.engine.script(
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    body = {"model": "m", "max_tokens": 200, "tools": [BASH],
            "messages": [{"role": "user", "content": "List the files."}]}  # fmt: skip
    with http_client() as http:
        r = post_messages(http, fake_gateway.url, key, body)
        assert r.status_code == 200, r.text
        assert r.json()["content"][0]["type"] == "tool_use"
        base = fake_gateway.url.removesuffix("/v1")
        page = http.get(f"{base}/ui/sessions/{sid}", headers=admin_headers()).text
    assert "<code>Bash({&#34;command&#34;: &#34;ls&#34;})</code>" in page
