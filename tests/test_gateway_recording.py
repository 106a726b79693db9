"""Recording fidelity: what the trainer will learn from is exactly what was served.

The first half runs against the instant fake engine; the second half against the real
embedded SmolLM2 engine (one module-scoped gateway), checking token ids, logprobs,
policy versions and batching against an independent forward pass of the model.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import sqlalchemy as sa
import torch
from gateway_helpers import (
    FAKE_REPLY,
    HTTP_TIMEOUT,
    bearer,
    completion_record,
    create_session,
    openai_client,
    read_session,
    store_connection,
)
from openai.types.chat import ChatCompletion

from gateway.inference.model_source import load_causal_lm, resolve_model_dir

# the fake-engine half runs on SQLite and on PostgreSQL
pytestmark = pytest.mark.both_stores

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def render_ids(tokenizer, messages):
    """The prompt exactly as the model's own chat template makes it (text, then encode)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


# ---- with the fake engine ----------------------------------------------------------------
def test_two_turn_conversation_links_to_its_parent(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    messages = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    first = client.chat.completions.create(model="default", messages=messages)
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "Unfortunately your answer is wrong. Try again."},
    ]
    second = client.chat.completions.create(model="default", messages=messages)
    other = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Name a colour."}]
    )

    rec1 = completion_record(fake_gateway, session_id, first.id)
    rec2 = completion_record(fake_gateway, session_id, second.id)
    rec3 = completion_record(fake_gateway, session_id, other.id)
    assert rec1["parent_id"] is None and rec1["tokens_continue_parent"] is None
    assert rec2["parent_id"] == first.id
    assert rec2["tokens_continue_parent"] is True
    # Token-exact continuation: turn 2's prompt starts with turn 1's prompt + output.
    prefix = rec1["prompt_ids"] + rec1["output_ids"]
    assert rec2["prompt_ids"][: len(prefix)] == prefix
    assert rec3["parent_id"] is None

    # The record holds what was asked and what was answered.
    assert rec2["request"]["messages"][-1]["content"].startswith("Unfortunately")
    assert len(rec2["request"]["messages"]) == 4
    assert rec2["response"]["message"] == {"role": "assistant", "content": FAKE_REPLY}
    assert rec2["finish_reason"] == "stop" == second.choices[0].finish_reason
    assert rec2["output_ids"] == tokenizer.encode(FAKE_REPLY, add_special_tokens=False) + [
        tokenizer.eos_token_id
    ]
    assert rec2["session_id"] == session_id
    assert read_session(fake_gateway, session_id)["stats"]["token_prefix_mismatches"] == 0


def test_turn_links_survive_sdk_reserialisation(fake_gateway, new_session, http):
    """Clients send the assistant turn back re-shaped (content parts, refusal: null)."""
    session_id, key = new_session(fake_gateway)
    url = f"{fake_gateway.url}/chat/completions"
    first = http.post(url, headers=bearer(key), json={"messages": QUESTION}).json()
    reshaped = {
        "role": "assistant",
        "content": [{"type": "text", "text": first["choices"][0]["message"]["content"]}],
        "refusal": None,
    }
    messages = [*QUESTION, reshaped, {"role": "user", "content": "And 3+3?"}]
    second = http.post(url, headers=bearer(key), json={"messages": messages}).json()
    rec = completion_record(fake_gateway, session_id, second["id"])
    assert rec["parent_id"] == first["id"]


def test_record_holds_sampling_params_and_length_finish(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    r = http.post(
        f"{fake_gateway.url}/chat/completions",
        headers=bearer(key),
        json={"messages": QUESTION, "max_tokens": 2, "temperature": 0.7, "top_p": 0.9, "seed": 5},
    )
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    rec = completion_record(fake_gateway, session_id, body["id"])
    assert rec["finish_reason"] == "length"
    assert rec["completion_tokens"] == len(rec["output_ids"]) == 2
    assert body["usage"]["completion_tokens"] == 2
    assert body["usage"]["prompt_tokens"] == rec["prompt_tokens"] == len(rec["prompt_ids"])
    for name, value in {"max_tokens": 2, "temperature": 0.7, "top_p": 0.9, "seed": 5}.items():
        assert rec["request"][name] == value
    # The engine was asked for exactly that.
    params = fake_gateway.engine.calls[-1][1]
    assert (params.max_new_tokens, params.temperature, params.top_p, params.seed) == (
        2,
        0.7,
        0.9,
        5,
    )


def test_max_completion_tokens_is_honoured(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, max_completion_tokens=3
    )
    assert answer.usage.completion_tokens == 3
    assert answer.choices[0].finish_reason == "length"


def test_stop_string_cuts_answer_and_recorded_tokens(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, stop=[" is"]
    )
    assert answer.choices[0].message.content == "The answer"
    assert answer.choices[0].finish_reason == "stop"
    rec = completion_record(fake_gateway, session_id, answer.id)
    # The recorded tokens are those that produced the text up to the stop string.
    assert tokenizer.decode(rec["output_ids"]).startswith("The answer is")
    assert len(rec["output_ids"]) == len(rec["output_logprobs"]) == rec["completion_tokens"]
    assert len(rec["output_ids"]) < len(tokenizer.encode(FAKE_REPLY, add_special_tokens=False))


@pytest.mark.parametrize("logprobs", [False, True])
def test_response_is_a_valid_openai_chat_completion(fake_gateway, new_session, http, logprobs):
    session_id, key = new_session(fake_gateway)
    r = http.post(
        f"{fake_gateway.url}/chat/completions",
        headers=bearer(key),
        json={"model": "default", "messages": QUESTION, "logprobs": logprobs},
    )
    assert r.status_code == 200
    completion = ChatCompletion.model_validate(r.json())
    assert completion.object == "chat.completion"
    assert completion.model == "default"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == FAKE_REPLY
    assert completion.usage is not None
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    rec = completion_record(fake_gateway, session_id, completion.id)
    if logprobs:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert len(choice.logprobs.content) == completion.usage.completion_tokens
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(rec["output_logprobs"])
    else:
        assert choice.logprobs is None


def test_every_answered_request_is_already_on_disk(fake_gateway, new_session, http):
    """A client that got a 200 never loses its record: it is committed before the reply."""
    _, key = new_session(fake_gateway)
    with store_connection(fake_gateway.config.database) as con:
        for i in range(10):
            r = http.post(
                f"{fake_gateway.url}/chat/completions",
                headers=bearer(key),
                json={"messages": [{"role": "user", "content": f"q{i}"}]},
            )
            assert r.status_code == 200
            row = con.execute(
                sa.text(
                    "SELECT length(prompt_ids), length(output_ids) FROM completions WHERE id = :id"
                ),
                {"id": r.json()["id"]},
            ).first()
            con.rollback()  # the next read sees the next commit
            assert row is not None, "a 200 was sent before the record was committed"
            # Token arrays are compact binary: 4 bytes a token.
            usage = r.json()["usage"]
            assert tuple(row) == (4 * usage["prompt_tokens"], 4 * usage["completion_tokens"])


async def test_concurrent_requests_are_all_recorded(fake_gateway, new_session):
    session_id, key = new_session(fake_gateway)
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    f"{fake_gateway.url}/chat/completions",
                    headers=bearer(key),
                    json={"messages": [{"role": "user", "content": f"question {i}"}]},
                )
                for i in range(40)
            )
        )
    assert all(r.status_code == 200 for r in responses)
    ids = {r.json()["id"] for r in responses}
    recorded = {c["id"] for c in read_session(fake_gateway, session_id)["completions"]}
    assert len(ids) == 40 and recorded == ids


# ---- with the real embedded engine -------------------------------------------------------
@pytest.fixture(scope="module")
def reference_model():
    """An independent copy of the model, for forward passes to check the engine against."""
    model = load_causal_lm(resolve_model_dir(None))
    model.eval()
    return model


@pytest.fixture(scope="module")
def embedded_key(embedded_gateway):
    return create_session(embedded_gateway.url)


async def chat_many(gateway, key, bodies):
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        responses = await asyncio.gather(
            *(
                client.post(f"{gateway.url}/chat/completions", headers=bearer(key), json=b)
                for b in bodies
            )
        )
    for r in responses:
        assert r.status_code == 200, r.text
    return [r.json() for r in responses]


def reference_logprobs(model, prompt_ids, output_ids):
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(output_ids) - 1)
    return logprobs[positions, torch.tensor(output_ids)]


def test_recorded_prompt_ids_are_the_chat_template(embedded_gateway, embedded_key, tokenizer):
    session_id, key = embedded_key
    messages = [
        {"role": "system", "content": "You are a terse math tutor."},
        {"role": "user", "content": "What is 12 * 3?"},
        {"role": "assistant", "content": "36."},
        {"role": "user", "content": "And divided by 4?"},
    ]
    answer = openai_client(embedded_gateway, key).chat.completions.create(
        model="default", messages=messages, max_tokens=2
    )
    rec = completion_record(embedded_gateway, session_id, answer.id)
    expected = render_ids(tokenizer, messages)
    assert rec["prompt_ids"] == expected
    assert answer.usage.prompt_tokens == len(expected)
    assert tokenizer.decode(rec["prompt_ids"]).endswith("<|im_start|>assistant\n")


async def test_recorded_logprobs_match_a_forward_pass(
    embedded_gateway, embedded_key, reference_model
):
    """Three prompts of different lengths in one batch (left padding), sampled at T=1."""
    session_id, key = embedded_key
    engine = embedded_gateway.engine
    prompts = [
        "Hi.",
        "Write one sentence about the sea.",
        "List three prime numbers bigger than ten, and explain briefly why each one is prime.",
    ]
    bodies = [
        {
            "messages": [{"role": "user", "content": p}],
            "temperature": 1.0,
            "max_tokens": 24,
            "logprobs": True,
            "seed": i,
        }
        for i, p in enumerate(prompts)
    ]
    waves_before = engine.waves
    wait = engine.batch_wait_s
    engine.batch_wait_s = 1.0  # make sure all three land in one wave
    try:
        answers = await chat_many(embedded_gateway, key, bodies)
    finally:
        engine.batch_wait_s = wait
    assert engine.waves - waves_before == 1, "the three requests were not batched together"

    prompt_lens = set()
    for answer in answers:
        rec = completion_record(embedded_gateway, session_id, answer["id"])
        prompt, output = rec["prompt_ids"], rec["output_ids"]
        prompt_lens.add(len(prompt))
        assert 1 <= len(output) <= 24
        assert len(rec["output_logprobs"]) == len(output) == len(rec["output_versions"])
        assert answer["usage"]["prompt_tokens"] == len(prompt) == rec["prompt_tokens"]
        assert answer["usage"]["completion_tokens"] == len(output) == rec["completion_tokens"]
        assert set(rec["output_versions"]) == {engine.version}

        expected = reference_logprobs(reference_model, prompt, output)
        got = torch.tensor(rec["output_logprobs"])
        diff = (got - expected).abs().max().item()
        assert diff < 1e-3, f"recorded logprobs differ from a forward pass by {diff}"
        # The logprobs in the response are the recorded ones.
        served = [t["logprob"] for t in answer["choices"][0]["logprobs"]["content"]]
        assert served == pytest.approx(rec["output_logprobs"], abs=1e-6)
        # finish reason agrees with the tokens
        if rec["finish_reason"] == "stop":
            assert output[-1] == 2  # <|im_end|>
        else:
            assert rec["finish_reason"] == "length" and len(output) == 24
    assert len(prompt_lens) == 3


async def test_concurrent_requests_are_batched(embedded_gateway, embedded_key):
    session_id, key = embedded_key
    engine = embedded_gateway.engine
    bodies = [
        {"messages": [{"role": "user", "content": f"Count to {i + 2}."}], "max_tokens": 6}
        for i in range(6)
    ]
    waves_before = engine.waves
    answers = await chat_many(embedded_gateway, key, bodies)
    waves = engine.waves - waves_before
    assert 1 <= waves < 6, f"6 concurrent requests took {waves} engine waves"
    recorded = {c["id"] for c in read_session(embedded_gateway, session_id)["completions"]}
    assert {a["id"] for a in answers} <= recorded


def test_two_turns_with_the_real_model_link_up(embedded_gateway, embedded_key):
    session_id, key = embedded_key
    client = openai_client(embedded_gateway, key)
    messages = [{"role": "user", "content": "Say a number."}]
    first = client.chat.completions.create(
        model="default", messages=messages, max_tokens=8, temperature=0
    )
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "Another one."},
    ]
    second = client.chat.completions.create(
        model="default", messages=messages, max_tokens=4, temperature=0
    )
    rec = completion_record(embedded_gateway, session_id, second.id)
    assert rec["parent_id"] == first.id
    assert isinstance(rec["tokens_continue_parent"], bool)


def test_weight_update_bumps_version_and_is_recorded(embedded_gateway, embedded_key):
    session_id, key = embedded_key
    engine = embedded_gateway.engine
    client = openai_client(embedded_gateway, key)

    def greedy():
        answer = client.chat.completions.create(
            model="default", messages=QUESTION, max_tokens=3, temperature=0
        )
        return completion_record(embedded_gateway, session_id, answer.id)

    original = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    before = greedy()
    v0 = engine.version
    assert set(before["output_versions"]) == {v0}

    modified = dict(original)
    modified["model.norm.weight"] = original["model.norm.weight"] * 1.5
    try:
        v1 = engine.load_state_dict(modified)
        assert v1 == engine.version == v0 + 1
        after = greedy()
        assert set(after["output_versions"]) == {v1}
        # The new weights really serve: same greedy prompt, different logprob.
        assert abs(after["output_logprobs"][0] - before["output_logprobs"][0]) > 1e-3
        health = httpx.get(f"{embedded_gateway.url.removesuffix('/v1')}/healthz").json()
        assert health["policy_version"] == v1
    finally:
        v2 = engine.load_state_dict(original)
    assert v2 == v1 + 1
    restored = greedy()
    assert set(restored["output_versions"]) == {v2}
    assert restored["output_ids"] == before["output_ids"]
    assert restored["output_logprobs"] == pytest.approx(before["output_logprobs"], abs=1e-4)
