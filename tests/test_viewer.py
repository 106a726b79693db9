"""The /ui viewer in a real headless Chromium, against a gateway holding a session
recorded from the real SmolLM2 engine: the tokens shown are the stored ids decoded,
the trained/masked split is the export's loss mask, the returns follow the discount
chosen on the page, drift and branches are marked; the run page charts metrics.jsonl
and picks up new steps while a run goes on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import chromium, screenshot
from gateway_helpers import ADMIN_KEY, WEATHER, admin_headers, bearer, http_client

from gateway.config import GatewayConfig
from gateway.server import BackgroundGateway

pytestmark = pytest.mark.slow

Q1 = [{"role": "user", "content": "What colour is the sky? Answer in one sentence."}]
RUN_ROWS = [
    {"step": s, "policy_version": s, "reward_mean": 0.2 + 0.1 * s, "reward_max": 1.0,
     "loss": 0.5 / s, "approx_kl": 0.001 * s, "clip_frac": 0.02 * s, "staleness_mean": 0.5,
     "staleness_max": 1.0, "packed_tokens_per_s": 900.0 + s, "trained_tokens_per_s": 300.0, "step_s": 10.0 + s, "rollout_wait_s": 2.0}
    for s in (1, 2, 3)
]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "sky-run"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, run_dir) -> Iterator[BackgroundGateway]:
    """The real in-process SmolLM2 engine, with a training run folder to chart."""
    db = tmp_path_factory.mktemp("viewer") / "v.db"
    config = GatewayConfig(
        port=0, database=str(db), admin_key=ADMIN_KEY, engine="embedded", run_dirs=[str(run_dir)]
    )
    with BackgroundGateway(config, engine=None) as gw:
        yield gw


def _chat(http, gw, key: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "default", "messages": messages, "max_tokens": 16, "temperature": 0.7,
            "seed": 1, "logprobs": True}  # fmt: skip
    r = http.post(f"{gw.url}/chat/completions", headers=bearer(key), json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def recorded(gateway) -> dict[str, Any]:
    """One session of three turns: t1, then two branches from it: t2 continues it, t3
    sends t1's answer back with whitespace in front (the same message to the gateway,
    other tokens to the model: a drift). Rewards on t1 and t2."""
    with http_client() as http:
        r = http.post(
            f"{gateway.url}/sessions",
            headers=admin_headers(),
            json={"metadata": {"run": "sky", "step": 1, "agent": "viewer-test"}},
        )
        sid, key = r.json()["id"], r.json()["api_key"]
        t1 = _chat(http, gateway, key, Q1)
        answer = t1["choices"][0]["message"]
        t2 = _chat(http, gateway, key, [*Q1, answer, {"role": "user", "content": "Why?"}])
        drifted = {"role": "assistant", "content": "\n\n" + (answer["content"] or "")}
        t3 = _chat(http, gateway, key, [*Q1, drifted, {"role": "user", "content": "Another?"}])
        r = http.post(
            f"{gateway.url}/rewards",
            headers=admin_headers(),
            json={"rewards": {t1["id"]: 0.25, t2["id"]: 1.0}},
        )
        assert r.status_code == 200, r.text
        session = http.get(f"{gateway.url}/sessions/{sid}", headers=admin_headers()).json()
    by_id = {c["id"]: c for c in session["completions"]}
    assert by_id[t2["id"]]["parent_id"] == t1["id"] == by_id[t3["id"]]["parent_id"]
    assert by_id[t3["id"]]["diagnostics"]["drift"]["cause"] == "whitespace"
    return {"id": sid, "key": key, "t1": t1["id"], "t2": t2["id"], "t3": t3["id"], "by_id": by_id}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser) -> Iterator[Any]:
    context = browser.new_context(
        viewport={"width": 1280, "height": 900},
        extra_http_headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    yield context.new_page()
    context.close()


def _ui(gw: BackgroundGateway) -> str:
    return gw.url.removesuffix("/v1") + "/ui"


def _export(gw, sid: str, style: str, gamma: float) -> list[dict[str, Any]]:
    with http_client() as http:
        r = http.get(
            f"{gw.url}/sessions/{sid}/export",
            params={"style": style, "turn_discount": gamma},
            headers=admin_headers(),
        )
    assert r.status_code == 200, r.text
    return r.json()["samples"]


def _shown(page, cid: str) -> dict[str, Any]:
    """What the page shows of one turn: token ids, texts, trained flags, return."""
    return page.evaluate(
        """(cid) => {
          const s = document.querySelector(`section.turn[data-turn="${cid}"]`);
          const toks = [...s.querySelectorAll(".tokens .tok")];
          return {
            shownFrom: +s.querySelector(".tokens").dataset.shownFrom,
            ids: toks.map((t) => +t.dataset.id),
            texts: toks.map((t) => t.textContent),
            trained: toks.map((t) => t.classList.contains("trained")),
            drift: toks.filter((t) => t.classList.contains("drift")).map((t) => +t.dataset.i),
            ret: s.querySelector(".return").dataset.return,
          };
        }""",
        cid,
    )


def _expected_mask(samples: list[dict[str, Any]], c: dict[str, Any]) -> list[int]:
    """The loss mask over this turn's prompt + output, read off the export: the sample
    that trains it starts with exactly these tokens."""
    ids = c["prompt_ids"] + c["output_ids"]
    [sample] = [s for s in samples if c["id"] in s["completion_ids"] and s["input_ids"][: len(ids)] == ids][:1]  # fmt: skip
    return sample["loss_mask"][: len(ids)]


def _expected_return(samples: list[dict[str, Any]], c: dict[str, Any]) -> float:
    for s in samples:
        if c["id"] in s["completion_ids"]:
            if s["token_returns"] is not None:
                return s["token_returns"][len(c["prompt_ids"])]
            return s["returns"]
    raise AssertionError(f"{c['id']} is in no sample")


@pytest.mark.parametrize("style", ["individual", "concat"])
def test_session_page_shows_stored_tokens_and_export_mask(
    gateway, recorded, page, tokenizer, style, tmp_path
):
    sid, by_id = recorded["id"], recorded["by_id"]
    page.goto(f"{_ui(gateway)}/sessions/{sid}?style={style}")
    samples = _export(gateway, sid, style, 1.0)
    trained_total = masked_total = 0
    for cid in (recorded["t1"], recorded["t2"], recorded["t3"]):
        c, shown = by_id[cid], _shown(page, cid)
        stored = c["prompt_ids"] + c["output_ids"]
        start = shown["shownFrom"]
        # every token from where this prompt stops repeating its parent, as stored
        assert shown["ids"] == stored[start:]
        singles = [tokenizer.decode([i]) for i in stored[start:]]
        # each token's own text; a character split over byte tokens sits on its last one
        for text, single in zip(shown["texts"], singles, strict=True):
            assert text == single or "\ufffd" in single
        assert "".join(shown["texts"]) == tokenizer.decode(stored[start:])
        mask = _expected_mask(samples, c)
        assert shown["trained"] == [bool(m) for m in mask[start:]]
        trained_total += sum(shown["trained"])
        masked_total += len(shown["trained"]) - sum(shown["trained"])
        assert float(shown["ret"]) == pytest.approx(_expected_return(samples, c))
    assert trained_total > 0 and masked_total > 0
    # the root shows its whole prompt; t2 starts after t1's prompt + output, if it continues
    assert _shown(page, recorded["t1"])["shownFrom"] == 0
    t1 = by_id[recorded["t1"]]
    if by_id[recorded["t2"]]["tokens_continue_parent"]:
        assert _shown(page, recorded["t2"])["shownFrom"] == len(t1["prompt_ids"] + t1["output_ids"])
    screenshot(page, tmp_path, f"viewer-session-{style}", full_page=True)


def test_drift_and_branches_are_marked(gateway, recorded, page):
    page.goto(f"{_ui(gateway)}/sessions/{recorded['id']}")
    t3 = recorded["by_id"][recorded["t3"]]
    at = t3["diagnostics"]["drift"]["at"]
    shown = _shown(page, recorded["t3"])
    assert shown["drift"] == [at] and shown["shownFrom"] == at  # first differing token
    note = page.locator(f'section.turn[data-turn="{recorded["t3"]}"] .drift-note').inner_text()
    assert f"drift at prompt token {at}" in note and "whitespace" in note
    t1_item = page.locator(f'nav.tree li[data-turn="{recorded["t1"]}"]')
    assert "branch ×2" in t1_item.inner_text()
    for child in (recorded["t2"], recorded["t3"]):  # each child links to its parent
        link = page.locator(f'section.turn[data-turn="{child}"] a.parent-link')
        assert link.get_attribute("href") == f"#turn-{recorded['t1']}"


def test_changing_the_discount_changes_the_returns(gateway, recorded, page, tmp_path):
    sid, t1 = recorded["id"], recorded["by_id"][recorded["t1"]]
    page.goto(f"{_ui(gateway)}/sessions/{sid}")
    before = float(_shown(page, t1["id"])["ret"])
    page.fill("#turn-discount", "0.5")
    with page.expect_navigation():
        page.press("#turn-discount", "Enter")
    assert "turn_discount=0.5" in page.url
    after = float(_shown(page, t1["id"])["ret"])
    # t1: 0.25 + gamma * mean(t2: 1.0, t3: 0.0), along its own branches
    assert before == pytest.approx(0.75) and after == pytest.approx(0.5)
    assert after == pytest.approx(_expected_return(_export(gateway, sid, "individual", 0.5), t1))
    screenshot(page, tmp_path, "viewer-discount")


def test_hovering_a_token_shows_id_text_logprob_version(gateway, recorded, page, tmp_path):
    t1 = recorded["by_id"][recorded["t1"]]
    page.goto(f"{_ui(gateway)}/sessions/{recorded['id']}")
    first_out = page.locator(f'section.turn[data-turn="{t1["id"]}"] .part.output .tok').first
    first_out.hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert f"id       {t1['output_ids'][0]}" in text
    assert f"logprob  {t1['output_logprobs'][0]:.4f}" in text
    assert f"version  {t1['output_versions'][0]}" in text and "trained" in text
    screenshot(page, tmp_path, "viewer-hover")


def test_sessions_list_filters(gateway, recorded, page, tmp_path):
    sid = recorded["id"]
    base = f"{_ui(gateway)}/sessions"

    def listed(query: str) -> list[str]:
        page.goto(f"{base}?{query}")
        return page.eval_on_selector_all("tr.session-row", "rs => rs.map(r => r.dataset.session)")

    page.goto(base)
    row = page.locator(f'tr.session-row[data-session="{sid}"]')
    assert row.locator(".turns").inner_text() == "3"
    assert row.locator(".reward").inner_text() == "1.250"  # 0.25 + 1.0
    assert "drift 1" in row.inner_text()
    screenshot(page, tmp_path, "viewer-sessions")
    assert sid in listed("status=active&reward=present&drift=yes&errors=no")
    assert sid in listed("run=sky&step=1&agent=viewer-test")
    assert sid not in listed("reward=missing")
    assert sid not in listed("drift=no")
    assert sid not in listed("status=ended")
    assert sid not in listed("run=other")
    assert sid not in listed("errors=yes")
    page.goto(f"{base}?status=bogus")
    assert "status must be" in page.locator("#error-message").inner_text()


def test_viewer_needs_the_admin_key(gateway, recorded, browser):
    context = browser.new_context()  # no Authorization header: a plain browser
    page = context.new_page()
    response = page.goto(f"{_ui(gateway)}/sessions")
    assert response.status == 401
    page.fill("input[name=key]", "wrong")
    page.press("input[name=key]", "Enter")
    page.wait_for_selector("#bad-key")
    page.fill("input[name=key]", ADMIN_KEY)
    page.press("input[name=key]", "Enter")
    page.wait_for_selector(f'tr.session-row[data-session="{recorded["id"]}"]')
    assert "key=" not in page.url  # the key moved into an HttpOnly cookie
    assert page.goto(f"{_ui(gateway)}/sessions/{recorded['id']}").status == 200
    context.close()


def test_run_page_charts_metrics_and_refreshes(gateway, run_dir, page, tmp_path):
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in RUN_ROWS))
    page.goto(f"{_ui(gateway)}/runs")
    page.click("text=sky-run")
    page.wait_for_selector("#status[data-steps='3']")
    titles = page.eval_on_selector_all(".chart h2", "hs => hs.map(h => h.textContent)")
    assert titles == [
        "Reward",
        "Loss",
        "KL and clip fraction",
        "Staleness (policy versions)",
        "Tokens per second (update)",
        "Step times (s)",
    ]
    assert page.locator(".chart canvas").count() == 6  # uPlot drew each
    # the trainer appends a step (and is mid-way through writing the next line)
    with metrics.open("a") as f:
        f.write(json.dumps({**RUN_ROWS[-1], "step": 4, "reward_mean": 0.9}) + "\n")
        f.write('{"step": 5, "rew')
    page.wait_for_selector("#status[data-steps='4']", timeout=15_000)
    screenshot(page, tmp_path, "viewer-run")


# the trainer's per-step signals at the magnitudes a real run has them (KL 1e-4, logprob
# mismatch 1e-5, a learning rate decaying from 3e-5), and two held-out evaluations
SIGNAL_ROWS = [
    {"step": s, "reward_mean": 0.3, "approx_kl": 1e-4 * s, "clip_frac": 2e-4 * s,
     "entropy": 1.2 - 0.1 * s, "kl_ref": 1e-4 * s, "logprob_mismatch": 1e-5 + 5e-6 * (s - 1),
     "answer_tokens_mean": 180.0 + 12 * s, "truncated_frac": 0.05 * s, "repetition": 0.02 * s,
     "zero_spread_frac": 0.25, "lr": 3e-5 * (1 - 0.15 * (s - 1))}
    for s in (1, 2, 3, 4, 5)
]  # fmt: skip
SIGNAL_EVALS = [
    {"step": 0, "accuracy": 0.375, "accuracy_ci": [0.296, 0.461], "reward_mean": 0.375},
    {"step": 5, "accuracy": 0.5, "accuracy_ci": [0.414, 0.586], "reward_mean": 0.5},
]
# what the page shows of each chart: its series, data, bands and y axes (uPlot draws the
# tick labels into the canvas; `_splits` / `_values` are the ticks and labels it drew)
PLOTS_JS = """() => Object.fromEntries(Object.entries(window.runPlots).map(([id, {plot}]) => [id, {
  series: plot.series.slice(1).map((s) => ({label: s.label, scale: s.scale})),
  data: plot.data, bands: (plot.bands || []).map((b) => b.series),
  y: plot.axes.slice(1).map((a) => ({scale: a.scale, splits: a._splits, labels: a._values,
    size: a._size, min: plot.scales[a.scale].min, max: plot.scales[a.scale].max})),
}]))"""


def test_run_page_charts_training_signals_with_readable_small_ticks(
    gateway_factory, page, tmp_path
):
    """The trainer's signals each have a chart; tiny values (KL ~1e-4, mismatch ~1e-5,
    lr ~1e-5) get tick labels that tell ticks apart and read as their values (they all
    read "0" with uPlot's own labels); held-out accuracy is drawn with its interval."""
    run = tmp_path / "signals-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SIGNAL_ROWS))
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in SIGNAL_EVALS))
    gw = gateway_factory({"run_dirs": [str(run)]})
    page.goto(f"{_ui(gw)}/runs/0")
    page.wait_for_selector("#status[data-steps='5']")
    titles = page.eval_on_selector_all(".chart h2", "hs => hs.map(h => h.textContent)")
    for title in (
        "Held-out accuracy",
        "Entropy and KL to the start",
        "Answers: cut off, repeated, groups with no spread",
        "Answer length (tokens)",
        "Sampler vs trainer logprob mismatch",
        "Learning rate",
        "KL and clip fraction",
    ):
        assert title in titles
    assert page.locator(".chart canvas").count() == len(titles)  # uPlot drew each
    plots = page.evaluate(PLOTS_JS)

    def labels(pid: str) -> list[str]:
        return [s["label"] for s in plots[pid]["series"]]

    entropy = plots["entropy-and-kl-to-the-start"]
    assert entropy["series"] == [{"label": "entropy", "scale": "y"}, {"label": "kl_ref", "scale": "right"}]  # fmt: skip
    assert [a["scale"] for a in entropy["y"]] == ["y", "right"]  # KL on its own axis
    assert labels("answers-cut-off-repeated-groups-with-no-spread") == ["truncated_frac", "repetition", "zero_spread_frac"]  # fmt: skip
    assert labels("answer-length-tokens-") == ["answer_tokens_mean"]
    assert labels("sampler-vs-trainer-logprob-mismatch") == ["logprob_mismatch"]
    assert labels("learning-rate") == ["lr"]

    for pid in (
        "kl-and-clip-fraction",
        "entropy-and-kl-to-the-start",
        "sampler-vs-trainer-logprob-mismatch",
        "learning-rate",
    ):
        for axis in plots[pid]["y"]:
            splits, shown = axis["splits"], axis["labels"]
            assert len(shown) >= 2 and len(set(shown)) == len(shown), (pid, shown)
            incr = splits[1] - splits[0]
            for split, label in zip(splits, shown, strict=True):
                assert label != "0" or split == 0, (pid, shown)
                assert float(label) == pytest.approx(split, abs=incr / 10), (pid, shown)
            assert axis["size"] >= 6 * max(map(len, shown)) + 10, (pid, shown)  # not cut off

    held_out = plots["held-out-accuracy"]
    assert labels("held-out-accuracy") == ["accuracy", "accuracy_ci_lo", "accuracy_ci_hi"]
    assert held_out["data"] == [[0, 5], [0.375, 0.5], [0.296, 0.414], [0.461, 0.586]]
    assert held_out["bands"] == [[3, 2]]  # shaded between hi and lo
    assert (held_out["y"][0]["min"], held_out["y"][0]["max"]) == (0, 1)
    screenshot(page, tmp_path, "viewer-run-signals", full_page=True)


def test_tool_calls_shown_as_such(fake_gateway, new_session, browser):
    """Fast: a scripted tool call from the fake engine is listed as a call."""
    sid, key = new_session(fake_gateway)
    fake_gateway.engine.script(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    with http_client() as http:
        r = http.post(
            f"{fake_gateway.url}/chat/completions",
            headers=bearer(key),
            json={"model": "default", "messages": Q1, "tools": [WEATHER]},
        )
    assert r.status_code == 200, r.text
    context = browser.new_context(extra_http_headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    page = context.new_page()
    page.goto(f"{_ui(fake_gateway)}/sessions/{sid}")
    call = page.locator(".tool-call").inner_text()
    assert 'get_weather({"city": "Paris"})' in call
    assert "tool call" in page.locator("nav.tree").inner_text()
    context.close()


def test_run_page_follows_a_real_training_run(tmp_path, tokenizer, browser):
    """`turnstile train` prints its run page; opened while it trains (a tiny model, the
    ReMax example, stopped by its time budget so that it trains for a while on any
    machine), the page shows the steps as they are made."""
    import os
    import queue
    import re
    import subprocess
    import sys
    import threading

    from trainer_helpers import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", tokenizer)
    run_dir, steps = tmp_path / "run", 1000
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "train", "--config", "agents/remax.yaml",
         f"run_dir={run_dir}", f"model={model}", "tensorboard=false", f"total_steps={steps}",
         "time_budget_s=25", "min_steps=15",  # steps for the page (3 s refresh) to see, however slow the start
         "rollout.batch_size=2", "workflow_kwargs.gconfig.max_new_tokens=16"],
        cwd=Path(__file__).resolve().parent.parent, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        url = None
        while url is None:
            found = re.match(r"dashboard: (http://127\.0\.0\.1:\d+/ui/runs/\d+\?key=\S+)", lines.get(timeout=300))  # fmt: skip
            url = found and found.group(1)
        context = browser.new_context()  # a plain browser: the key comes in the link
        page = context.new_page()
        page.goto(url)
        assert "key=" not in page.url  # moved into the cookie
        # the page is open before the first step (the model is still loading) ...
        page.wait_for_selector("#status[data-steps]")
        seen = {int(page.locator("#status").get_attribute("data-steps"))}
        while proc.poll() is None and len(seen) < 3:
            page.wait_for_timeout(500)
            seen.add(int(page.locator("#status").get_attribute("data-steps")))
        # ... and shows the steps made since, without a reload, while the run trains
        assert len(seen) >= 2 and max(seen) > 0 and max(seen) <= steps, (
            seen,
            proc.poll(),
            "".join(list(lines.queue)[-30:]),  # what the run said, if it ended
        )
        assert page.locator("#chart-reward canvas").count() == 1
        context.close()
        assert proc.wait(timeout=600) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    made = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert max(seen) <= made < steps  # the budget ended it, and every step made was written
