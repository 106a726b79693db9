"""`POST /v1/completions`: raw prompts (text or token ids), recorded and rewardable like chat."""

from __future__ import annotations

import openai
import pytest
from gateway_helpers import (
    FAKE_REPLY,
    assert_error_shape,
    bearer,
    completion_record,
    openai_client,
    read_session,
)


def test_text_prompt_is_tokenised_as_given_and_recorded(
    fake_gateway, new_session, tokenizer
) -> None:
    sid, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    resp = client.completions.create(model="default", prompt="2 + 2 =", max_tokens=20)
    assert resp.object == "text_completion"
    assert resp.choices[0].text == FAKE_REPLY
    assert resp.choices[0].finish_reason == "stop"
    rec = completion_record(fake_gateway, sid, resp.id)
    # no chat template: exactly the prompt's own tokens
    assert rec["prompt_ids"] == tokenizer.encode("2 + 2 =", add_special_tokens=False)
    assert rec["endpoint"] == "completions"
    assert len(rec["output_logprobs"]) == len(rec["output_ids"]) == len(rec["output_versions"])
    assert resp.usage.prompt_tokens == len(rec["prompt_ids"])
    assert resp.usage.completion_tokens == len(rec["output_ids"])


def test_token_id_prompt_reaches_the_engine_unchanged(fake_gateway, new_session) -> None:
    sid, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    ids = [1, 4093, 198, 1780, 314]
    resp = client.completions.create(model="default", prompt=ids, max_tokens=20)
    assert fake_gateway.engine.calls[-1][0] == ids
    assert completion_record(fake_gateway, sid, resp.id)["prompt_ids"] == ids


def test_batched_prompts_and_n_each_get_their_own_rewardable_record(
    fake_gateway, new_session, http
) -> None:
    sid, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    resp = client.completions.create(model="default", prompt=["a", "b"], n=2, max_tokens=20)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    view = read_session(fake_gateway, sid)
    ids = {c["id"] for c in view["completions"]}
    assert len(ids) == 4 and resp.id in ids
    for cid in ids:
        r = http.post(
            f"{fake_gateway.url}/rewards",
            headers=bearer(key),
            json={"completion_id": cid, "reward": 0.5},
        )
        assert r.status_code == 200


def test_logprobs_are_returned_when_asked(fake_gateway, new_session) -> None:
    sid, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    resp = client.completions.create(model="default", prompt="hi", max_tokens=20, logprobs=0)
    lp = resp.choices[0].logprobs
    rec = completion_record(fake_gateway, sid, resp.id)
    assert lp is not None
    # one logprob per recorded output token, equal to what was recorded
    assert lp.token_logprobs == pytest.approx(rec["output_logprobs"])
    assert "".join(lp.tokens).startswith(FAKE_REPLY)


def test_streaming_returns_the_same_text_and_records_it(fake_gateway, new_session) -> None:
    sid, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    stream = client.completions.create(
        model="default",
        prompt="hello",
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == FAKE_REPLY
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["stop"]
    rec = completion_record(fake_gateway, sid, chunks[0].id)
    assert rec["response"]["text"] == FAKE_REPLY


def test_stop_string_cuts_the_text(fake_gateway, new_session) -> None:
    _, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    resp = client.completions.create(model="default", prompt="x", max_tokens=20, stop=["is"])
    assert resp.choices[0].text == FAKE_REPLY[: FAKE_REPLY.index("is")]
    assert resp.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "default"}, 400),  # no prompt
        ({"model": "default", "prompt": ""}, 400),
        ({"model": "default", "prompt": [10**9]}, 400),  # token id out of the vocabulary
        ({"model": "default", "prompt": "x", "echo": True, "logprobs": 1}, 400),
    ],
)
def test_bad_requests_get_openai_errors(fake_gateway, new_session, http, body, status) -> None:
    _, key = new_session(fake_gateway)
    r = http.post(f"{fake_gateway.url}/completions", headers=bearer(key), json=body)
    assert_error_shape(r, status)


def test_prompt_longer_than_the_context_is_context_length_exceeded(
    gateway_factory, new_session
) -> None:
    gw = gateway_factory(max_context=16)
    _, key = new_session(gw)
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(gw, key).completions.create(model="default", prompt=list(range(100, 140)))
    assert err.value.code == "context_length_exceeded"
