"""Streaming chat completions (`stream: true`): real SSE, real incremental tokens, records.

Fake-engine tests first; the last ones run the real embedded SmolLM2 model.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import httpx
import openai
import pytest
from gateway_helpers import (
    FAKE_REPLY,
    HTTP_TIMEOUT,
    admin_headers,
    bearer,
    completion_record,
    create_session,
    openai_client,
    read_session,
)

from gateway.chat.detokenize import IncrementalDecoder, text_decoder

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
LONG_REPLY = "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."


def sse_frames(response: httpx.Response) -> list[str]:
    """The raw `data:` payloads of an SSE response, checking the framing on the way."""
    text = response.read().decode()
    assert text.endswith("\n\n"), text[-50:]
    frames = text.split("\n\n")[:-1]
    for frame in frames:
        assert frame.startswith("data: "), frame
    return [f.removeprefix("data: ") for f in frames]


def test_stream_with_openai_client_is_recorded(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    stream = openai_client(fake_gateway, key).chat.completions.create(
        model="default",
        messages=QUESTION,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].index == 0 for c in with_choices)
    assert "".join(c.choices[0].delta.content or "" for c in with_choices) == FAKE_REPLY
    assert [c.choices[0].finish_reason for c in with_choices][-1] == "stop"
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    # include_usage: one last chunk without choices, with the usage of the whole answer
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert len({c.id for c in chunks}) == 1

    rec = completion_record(fake_gateway, session_id, chunks[0].id)
    assert rec["output_ids"] == tokenizer.encode(FAKE_REPLY, add_special_tokens=False) + [
        tokenizer.eos_token_id
    ]
    assert rec["response"]["message"] == {"role": "assistant", "content": FAKE_REPLY}
    assert chunks[-1].usage.completion_tokens == rec["completion_tokens"]
    assert chunks[-1].usage.prompt_tokens == rec["prompt_tokens"]
    assert rec["finish_reason"] == "stop"


def test_sse_framing_ends_with_done(fake_gateway, new_session, http):
    """Clients send `Accept: application/json` even when they stream: `stream` decides."""
    _, key = new_session(fake_gateway)
    r = http.post(
        f"{fake_gateway.url}/chat/completions",
        headers={**bearer(key), "accept": "application/json"},
        json={"messages": QUESTION, "stream": True},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(r)
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(ch["index"] == 0 for c in chunks for ch in c["choices"])
    # no usage chunk unless asked for
    assert all(c["choices"] for c in chunks)


async def test_tokens_are_streamed_as_they_are_generated(gateway_factory, new_session):
    """The first text arrives long before the engine has finished the answer."""
    gw = gateway_factory(token_delay_s=0.05)
    gw.engine.script(LONG_REPLY)
    _, key = new_session(gw)
    client = openai.AsyncOpenAI(base_url=gw.url, api_key=key, max_retries=0, timeout=60)
    started = time.perf_counter()
    arrivals: list[tuple[float, str]] = []
    stream = await client.chat.completions.create(model="default", messages=QUESTION, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append((time.perf_counter() - started, chunk.choices[0].delta.content))
    total = time.perf_counter() - started
    assert "".join(text for _, text in arrivals) == LONG_REPLY
    assert len(arrivals) >= 10, "the answer came in a few big pieces, not token by token"
    assert total > 0.5  # ~20 tokens at 50 ms each
    assert arrivals[0][0] < total / 3, (arrivals[0][0], total)


def wait_for_completions(gateway, session_id, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        completions = read_session(gateway, session_id)["completions"]
        if len(completions) >= count or time.monotonic() > deadline:
            return completions
        time.sleep(0.05)


def test_record_is_committed_when_client_disconnects(gateway_factory, new_session, tokenizer):
    gw = gateway_factory(token_delay_s=0.05)
    gw.engine.script(LONG_REPLY)
    session_id, key = new_session(gw)
    with httpx.Client(timeout=HTTP_TIMEOUT) as client:
        with client.stream(
            "POST",
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={"messages": QUESTION, "stream": True},
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if '"content":"One' in line:
                    break  # got the first words: hang up
    completions = wait_for_completions(gw, session_id, 1)
    assert len(completions) == 1, "the disconnected stream was not recorded"
    rec = completions[0]
    full = tokenizer.encode(LONG_REPLY, add_special_tokens=False)
    # Generation stopped when the client left; what was made is recorded exactly.
    assert rec["finish_reason"] == "abort"
    assert 1 <= rec["completion_tokens"] < len(full)
    assert rec["output_ids"] == full[: len(rec["output_ids"])]
    assert len(rec["output_logprobs"]) == len(rec["output_versions"]) == rec["completion_tokens"]
    assert gw.state.stages.admission.pending == 0

    # Recorded, but not a training sample: the agent never used it.
    answer = openai_client(gw, key).chat.completions.create(model="default", messages=QUESTION)
    with httpx.Client(timeout=HTTP_TIMEOUT) as client:
        client.post(
            f"{gw.url}/rewards", headers=admin_headers(), json={"rewards": {answer.id: 1.0}}
        )
        samples = client.get(
            f"{gw.url}/sessions/{session_id}/export", headers=admin_headers()
        ).json()["samples"]
    assert [s["completion_ids"] for s in samples] == [[answer.id]]


def test_record_is_committed_before_the_finish_chunk(gateway_factory, new_session):
    gw = gateway_factory(token_delay_s=0.01)
    _, key = new_session(gw)
    con = sqlite3.connect(gw.config.database)
    try:
        with httpx.Client(timeout=HTTP_TIMEOUT) as client:
            with client.stream(
                "POST",
                f"{gw.url}/chat/completions",
                headers=bearer(key),
                json={"messages": QUESTION, "stream": True},
            ) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    if chunk["choices"][0]["finish_reason"]:
                        row = con.execute(
                            "SELECT finish_reason FROM completions WHERE id = ?", (chunk["id"],)
                        ).fetchone()
                        assert row == ("stop",), "finish_reason was sent before the record"
                        break
                else:
                    pytest.fail("no finish_reason chunk")
    finally:
        con.close()


def test_stream_stop_string_never_leaks_past_the_stop(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    stream = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, stream=True, stop=[" is 4"]
    )
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "The answer"
    assert chunks[-1].choices[0].finish_reason == "stop"
    rec = completion_record(fake_gateway, session_id, chunks[0].id)
    assert rec["response"]["message"]["content"] == "The answer"
    assert tokenizer.decode(rec["output_ids"]).startswith("The answer is 4")


def test_stream_logprobs_cover_every_recorded_token(fake_gateway, new_session):
    session_id, key = new_session(fake_gateway)
    stream = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, stream=True, logprobs=True, top_logprobs=2
    )
    chunks = [c for c in stream if c.choices]
    entries = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    rec = completion_record(fake_gateway, session_id, chunks[0].id)
    assert [e.logprob for e in entries] == pytest.approx(rec["output_logprobs"])
    assert all(len(e.top_logprobs) == 2 for e in entries)


def test_stream_n_choices_are_interleaved_and_each_recorded(gateway_factory, new_session):
    gw = gateway_factory(token_delay_s=0.01)
    session_id, key = new_session(gw)
    stream = openai_client(gw, key).chat.completions.create(
        model="default", messages=QUESTION, stream=True, n=2, seed=7
    )
    chunks = [c for c in stream if c.choices]
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        ch = c.choices[0]
        texts[ch.index] += ch.delta.content or ""
        if ch.finish_reason:
            finishes[ch.index] = ch.finish_reason
    assert texts == {0: FAKE_REPLY, 1: FAKE_REPLY}
    assert finishes == {0: "stop", 1: "stop"}
    first = chunks[0].id
    recorded = {c["id"]: c for c in read_session(gw, session_id)["completions"]}
    assert set(recorded) == {first, f"{first}-1"}
    assert sorted(c["choice_index"] for c in recorded.values()) == [0, 1]


def test_dead_engine_stream_is_503_before_streaming(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    fake_gateway.engine.alive = False
    with pytest.raises(openai.InternalServerError) as info:
        openai_client(fake_gateway, key).chat.completions.create(
            model="default", messages=QUESTION, stream=True
        )
    assert info.value.status_code == 503
    assert info.value.code == "engine_unavailable"
    assert fake_gateway.state.stages.admission.pending == 0


def test_engine_too_slow_mid_stream_ends_with_an_error_event(gateway_factory, new_session):
    """A stalled engine never hangs a stream: the deadline ends it with an error frame."""
    gw = gateway_factory(token_delay_s=0.1, config={"request_timeout_s": 0.6})
    gw.engine.script(LONG_REPLY)
    _, key = new_session(gw)
    started = time.perf_counter()
    received = ""
    with pytest.raises(openai.APIError) as info:
        stream = openai_client(gw, key).chat.completions.create(
            model="default", messages=QUESTION, stream=True
        )
        for chunk in stream:
            if chunk.choices:
                received += chunk.choices[0].delta.content or ""
    assert received and LONG_REPLY.startswith(received)
    assert "did not answer" in str(info.value)
    assert time.perf_counter() - started < 5


# ---- text deltas from tokens -------------------------------------------------------------
MIXED = "Crème brûlée 東京 🙂 costs 4 euros. The end"


def test_deltas_never_split_a_character(tokenizer):
    ids = tokenizer.encode(MIXED, add_special_tokens=False) + [tokenizer.eos_token_id]
    decoder = IncrementalDecoder(text_decoder(tokenizer), [tokenizer.eos_token_id])
    pieces = [decoder.feed([t]) for t in ids] + [decoder.finish()]
    assert "".join(pieces) == MIXED
    assert not any("\ufffd" in p for p in pieces)
    assert decoder.kept_ids == ids


@pytest.mark.parametrize("stops", [["4 euros"], ["euros", "東"], ["🙂"]])
def test_stop_string_split_across_tokens_is_held_back(tokenizer, stops):
    ids = tokenizer.encode(MIXED, add_special_tokens=False)
    decoder = IncrementalDecoder(text_decoder(tokenizer), [tokenizer.eos_token_id], stops)
    pieces = []
    for t in ids:
        pieces.append(decoder.feed([t]))
        if decoder.stopped:
            break
    pieces.append(decoder.finish())
    cut = min(MIXED.index(s) for s in stops)
    assert "".join(pieces) == MIXED[:cut] == decoder.final_text
    # the kept tokens are the fewest that reach the stop string
    kept = decoder.kept_ids
    assert any(s in tokenizer.decode(kept) for s in stops)
    assert not any(s in tokenizer.decode(kept[:-1]) for s in stops)


# ---- with the real embedded engine -------------------------------------------------------
@pytest.fixture(scope="module")
def embedded_key(embedded_gateway):
    return create_session(embedded_gateway.url)


def test_real_model_stream_is_the_recorded_tokens(embedded_gateway, embedded_key, tokenizer):
    """What was streamed, text and logprobs, is exactly what the recorded tokens say."""
    session_id, key = embedded_key
    client = openai_client(embedded_gateway, key)
    messages = [{"role": "user", "content": "Write a sentence about café crème and 東京."}]
    stream = client.chat.completions.create(
        model="default",
        messages=messages,
        stream=True,
        max_tokens=32,
        temperature=0,
        logprobs=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    rec = completion_record(embedded_gateway, session_id, chunks[0].id)
    ids = rec["output_ids"]
    if ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    assert streamed == tokenizer.decode(ids) == rec["response"]["message"]["content"]
    assert "\ufffd" not in streamed
    lps = [
        e.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert lps == pytest.approx(rec["output_logprobs"], abs=1e-6)
    assert chunks[-1].usage.completion_tokens == rec["completion_tokens"]

    # The same greedy request without streaming gives the same answer.
    plain = client.chat.completions.create(
        model="default", messages=messages, max_tokens=32, temperature=0
    )
    assert plain.choices[0].message.content == streamed


async def test_real_model_streams_while_generating(embedded_gateway, embedded_key):
    session_id, key = embedded_key
    client = openai.AsyncOpenAI(base_url=embedded_gateway.url, api_key=key, max_retries=0)
    started = time.perf_counter()
    first = None
    stream = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Count from one to twenty in words."}],
        stream=True,
        max_tokens=48,
        temperature=0,
    )
    pieces = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
            first = first or time.perf_counter() - started
    total = time.perf_counter() - started
    assert pieces > 10
    assert first is not None and first < total / 2, (first, total)
    await asyncio.sleep(0)
