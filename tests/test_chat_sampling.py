"""Sampling fields (`n`, `stop`, token limits, logprobs), and client retries."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest
from gateway_helpers import (
    FAKE_REPLY,
    HTTP_TIMEOUT,
    admin_headers,
    assert_error_shape,
    bearer,
    completion_record,
    create_session,
    openai_client,
    read_session,
)

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def metric(gateway, name: str) -> float:
    text = httpx.get(f"{gateway.url.removesuffix('/v1')}/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


# ---- n > 1 -------------------------------------------------------------------------------
def test_n_choices_are_each_recorded_and_rewardable(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, n=3, seed=11, temperature=0.8
    )
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(c.message.content == FAKE_REPLY for c in answer.choices)
    ids = [answer.id, f"{answer.id}-1", f"{answer.id}-2"]
    records = [completion_record(fake_gateway, session_id, cid) for cid in ids]
    assert [r["choice_index"] for r in records] == [0, 1, 2]
    # usage: the prompt once, the completions of all choices
    assert answer.usage.prompt_tokens == records[0]["prompt_tokens"]
    assert answer.usage.completion_tokens == sum(r["completion_tokens"] for r in records)
    # each choice its own reproducible seed; all generated concurrently
    seeds = sorted(params.seed for _, params in fake_gateway.engine.calls)
    assert seeds == [11, 12, 13]

    r = http.post(
        f"{fake_gateway.url}/rewards",
        headers=bearer(key),
        json={"rewards": {ids[2]: 1.0, ids[0]: 0}},
    )
    assert r.status_code == 200, r.text
    rewards = {c["id"]: c["reward"] for c in read_session(fake_gateway, session_id)["completions"]}
    assert rewards == {ids[0]: 0.0, ids[1]: None, ids[2]: 1.0}
    samples = http.get(
        f"{fake_gateway.url}/sessions/{session_id}/export", headers=admin_headers()
    ).json()["samples"]
    assert sorted(s["completion_ids"][0] for s in samples) == sorted(ids)


def test_a_later_turn_links_to_the_choice_it_continues(fake_gateway, new_session):
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    fake_gateway.engine.script("Four.", "It is 4.")
    first = client.chat.completions.create(model="default", messages=QUESTION, n=2)
    picked = first.choices[1]
    assert picked.message.content == "It is 4."
    messages = [
        *QUESTION,
        picked.message.model_dump(exclude_none=True),
        {"role": "user", "content": "Sure?"},
    ]
    second = client.chat.completions.create(model="default", messages=messages)
    rec = completion_record(fake_gateway, session_id, second.id)
    assert rec["parent_id"] == f"{first.id}-1"
    assert rec["tokens_continue_parent"] is True


def test_n_too_large_is_422(gateway_factory, new_session):
    gw = gateway_factory(config={"max_n": 4})
    _, key = new_session(gw)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        openai_client(gw, key).chat.completions.create(model="default", messages=QUESTION, n=5)
    assert info.value.code == "n_too_large" and info.value.param == "n"
    assert gw.engine.calls == []


# ---- stop, token limits, logprobs --------------------------------------------------------
@pytest.mark.parametrize("stop", ["4", ["zzz", "answer"]], ids=["string", "list"])
def test_stop_cuts_text_and_recorded_tokens_agree(fake_gateway, new_session, tokenizer, stop):
    session_id, key = new_session(fake_gateway)
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, stop=stop
    )
    expected = FAKE_REPLY[: FAKE_REPLY.index("4" if stop == "4" else "answer")]
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "stop"
    rec = completion_record(fake_gateway, session_id, answer.id)
    text = tokenizer.decode(rec["output_ids"])
    # the recorded tokens are the fewest that reach the stop string
    assert text.startswith(expected) and ("4" if stop == "4" else "answer") in text
    assert "4" not in tokenizer.decode(rec["output_ids"][:-1]) or stop != "4"
    assert answer.usage.completion_tokens == rec["completion_tokens"] == len(rec["output_ids"])


def test_max_completion_tokens_wins_over_max_tokens(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, max_tokens=50, max_completion_tokens=2
    )
    assert answer.usage.completion_tokens == 2
    assert answer.choices[0].finish_reason == "length"
    assert fake_gateway.engine.calls[-1][1].max_new_tokens == 2


def test_top_logprobs_are_returned(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, logprobs=True, top_logprobs=3
    )
    content = answer.choices[0].logprobs.content
    rec = completion_record(fake_gateway, session_id, answer.id)
    assert len(content) == rec["completion_tokens"]
    assert [t.token for t in content] == [tokenizer.decode([i]) for i in rec["output_ids"]]
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert [a.logprob for a in entry.top_logprobs] == sorted(
            (a.logprob for a in entry.top_logprobs), reverse=True
        )
    assert fake_gateway.engine.calls[-1][1].top_logprobs == 3
    # without `logprobs`, nothing is computed or returned
    plain = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, top_logprobs=3
    )
    assert plain.choices[0].logprobs is None
    assert fake_gateway.engine.calls[-1][1].top_logprobs == 0


def test_more_unknown_fields_are_ignored(fake_gateway, new_session, http):
    _, key = new_session(fake_gateway)
    tool = {
        "type": "function",
        "function": {"name": "f", "strict": True, "parameters": {"type": "object"}},
    }
    body = {
        "messages": QUESTION,
        "tools": [tool],
        "parallel_tool_calls": True,
        "reasoning": {"effort": "low"},
        "reasoning_effort": "low",
        "store": True,
        "metadata": {"a": "b"},
        "user": "u",
        "prediction": None,
        "modalities": ["text"],
        "logit_bias": {"1": 0},
        "presence_penalty": 0,
    }
    r = http.post(f"{fake_gateway.url}/chat/completions", headers=bearer(key), json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == FAKE_REPLY


# ---- retries -----------------------------------------------------------------------------
def post_raw(http, gateway, key, body: bytes, retry: int | None = None):
    headers = {**bearer(key), "content-type": "application/json"}
    if retry is not None:
        headers["x-stainless-retry-count"] = str(retry)
    return http.post(f"{gateway.url}/chat/completions", headers=headers, content=body)


@pytest.mark.both_stores
def test_retry_with_the_same_body_is_not_a_second_sample(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    body = json.dumps({"messages": QUESTION, "logprobs": True}).encode()
    first = post_raw(http, fake_gateway, key, body, retry=0)
    retried = post_raw(http, fake_gateway, key, body, retry=1)
    assert retried.status_code == 200
    assert retried.json()["id"] == first.json()["id"]
    assert retried.json()["choices"] == first.json()["choices"]
    assert len(read_session(fake_gateway, session_id)["completions"]) == 1
    assert len(fake_gateway.engine.calls) == 1
    assert metric(fake_gateway, "turnstile_retries_replayed_total") == 1

    # The same body without the retry header is a new request (a new sample) ...
    again = post_raw(http, fake_gateway, key, body)
    assert again.json()["id"] != first.json()["id"]
    # ... and a "retry" of a body never seen before is served normally.
    other = json.dumps({"messages": [{"role": "user", "content": "New?"}]}).encode()
    assert post_raw(http, fake_gateway, key, other, retry=2).status_code == 200
    assert len(read_session(fake_gateway, session_id)["completions"]) == 3


@pytest.mark.both_stores
def test_retry_of_another_session_body_is_generated_afresh(fake_gateway, new_session, http):
    _, key_a = new_session(fake_gateway)
    _, key_b = new_session(fake_gateway)
    body = json.dumps({"messages": QUESTION}).encode()
    a = post_raw(http, fake_gateway, key_a, body)
    b = post_raw(http, fake_gateway, key_b, body, retry=1)
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.both_stores
async def test_retry_while_the_original_still_runs_waits_for_it(gateway_factory, new_session):
    gw = gateway_factory(delay_s=0.5)
    session_id, key = new_session(gw)
    body = json.dumps({"messages": QUESTION}).encode()
    headers = {**bearer(key), "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        url = f"{gw.url}/chat/completions"
        original = asyncio.create_task(client.post(url, headers=headers, content=body))
        await asyncio.sleep(0.15)
        retried = await client.post(
            url, headers={**headers, "x-stainless-retry-count": "1"}, content=body
        )
        first = await original
    assert retried.json()["id"] == first.json()["id"]
    assert len(gw.engine.calls) == 1
    assert len(read_session(gw, session_id)["completions"]) == 1


@pytest.mark.both_stores
def test_openai_sdk_retry_after_client_timeout_is_deduplicated(gateway_factory, new_session):
    """The real SDK times out, retries with the same body, and gets the original answer."""
    gw = gateway_factory(delay_s=0.8)
    session_id, key = new_session(gw)
    client = openai.OpenAI(base_url=gw.url, api_key=key, max_retries=2, timeout=0.5)
    answer = client.chat.completions.create(model="default", messages=QUESTION)
    assert answer.choices[0].message.content == FAKE_REPLY
    completions = read_session(gw, session_id)["completions"]
    assert [c["id"] for c in completions] == [answer.id]
    assert len(gw.engine.calls) == 1


@pytest.mark.both_stores
def test_streamed_retry_is_replayed_as_a_stream(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    body = json.dumps({"messages": QUESTION, "stream": True}).encode()
    first = post_raw(http, fake_gateway, key, body)
    retried = post_raw(http, fake_gateway, key, body, retry=1)
    assert retried.headers["content-type"].startswith("text/event-stream")

    def text_and_id(response):
        frames = [f.removeprefix("data: ") for f in response.text.split("\n\n") if f]
        assert frames[-1] == "[DONE]"
        chunks = [json.loads(f) for f in frames[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        return text, chunks[0]["id"], chunks[-1]["choices"][0]["finish_reason"]

    assert text_and_id(retried) == text_and_id(first) == (FAKE_REPLY, first_id(first), "stop")
    assert len(read_session(fake_gateway, session_id)["completions"]) == 1


def first_id(response) -> str:
    return json.loads(response.text.split("\n\n")[0].removeprefix("data: "))["id"]


# ---- errors ------------------------------------------------------------------------------
def test_body_over_the_limit_is_413(gateway_factory, new_session, http):
    gw = gateway_factory(config={"max_body_bytes": 4096})
    _, key = new_session(gw)
    big = [{"role": "user", "content": "x" * 5000}]
    r = http.post(f"{gw.url}/chat/completions", headers=bearer(key), json={"messages": big})
    err = assert_error_shape(r, 413)
    assert err["code"] == "request_too_large"
    assert r.headers["x-should-retry"] == "false"
    # chunked upload without a content-length is cut off too
    body = json.dumps({"messages": big}).encode()

    def chunks():
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    r = http.post(f"{gw.url}/chat/completions", headers=bearer(key), content=chunks())
    assert_error_shape(r, 413)
    assert gw.engine.calls == []
    ok = http.post(f"{gw.url}/chat/completions", headers=bearer(key), json={"messages": QUESTION})
    assert ok.status_code == 200


async def test_too_many_pending_requests_is_429(gateway_factory, new_session):
    gw = gateway_factory(delay_s=0.5, config={"max_pending_requests": 2})
    _, key = new_session(gw)
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{gw.url}/chat/completions",
                    headers=bearer(key),
                    json={"messages": [{"role": "user", "content": f"q{i}"}]},
                )
                for i in range(4)
            )
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 429, 429]
    rejected = next(r for r in responses if r.status_code == 429)
    err = assert_error_shape(rejected, 429)
    assert err["code"] == "too_many_pending_requests"
    assert rejected.headers["x-should-retry"] == "true"
    assert gw.state.stages.admission.pending == 0
    # capacity is back once they are done
    ok = httpx.post(
        f"{gw.url}/chat/completions", headers=bearer(key), json={"messages": QUESTION, "n": 2}
    )
    assert ok.status_code == 200


def test_slow_engine_times_out_with_503(gateway_factory, new_session, http):
    gw = gateway_factory(delay_s=5, config={"request_timeout_s": 0.3})
    _, key = new_session(gw)
    r = http.post(f"{gw.url}/chat/completions", headers=bearer(key), json={"messages": QUESTION})
    err = assert_error_shape(r, 503)
    assert err["code"] == "engine_timeout"
    assert r.elapsed.total_seconds() < 3
    assert gw.state.stages.admission.pending == 0


# ---- with the real embedded engine -------------------------------------------------------
@pytest.fixture(scope="module")
def embedded_key(embedded_gateway):
    return create_session(embedded_gateway.url)


def test_real_model_top_logprobs(embedded_gateway, embedded_key):
    session_id, key = embedded_key
    answer = openai_client(embedded_gateway, key).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    rec = completion_record(embedded_gateway, session_id, answer.id)
    content = answer.choices[0].logprobs.content
    assert [t.logprob for t in content] == pytest.approx(rec["output_logprobs"], abs=1e-6)
    for entry in content:
        alts = entry.top_logprobs
        assert len(alts) == 5
        assert [a.logprob for a in alts] == sorted((a.logprob for a in alts), reverse=True)
        # greedy: the chosen token is the most likely one
        assert alts[0].token == entry.token
        assert alts[0].logprob == pytest.approx(entry.logprob, abs=1e-5)


async def test_real_model_n_choices_are_batched_and_differ(embedded_gateway, embedded_key):
    session_id, key = embedded_key
    engine = embedded_gateway.engine
    waves = engine.waves
    client = openai.AsyncOpenAI(base_url=embedded_gateway.url, api_key=key, max_retries=0)
    answer = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Tell me a random animal."}],
        n=4,
        max_tokens=12,
        temperature=1.0,
        seed=3,
    )
    assert engine.waves - waves == 1, "the choices were not generated in one batch"
    texts = {c.message.content for c in answer.choices}
    assert len(texts) > 1, "four seeds gave the same answer"
    ids = [answer.id] + [f"{answer.id}-{i}" for i in range(1, 4)]
    for i, cid in enumerate(ids):
        rec = completion_record(embedded_gateway, session_id, cid)
        assert rec["response"]["message"]["content"] == answer.choices[i].message.content
        assert set(rec["output_versions"]) == {engine.version}
