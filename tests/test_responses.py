"""`POST /v1/responses`: the Responses API, served and recorded like a chat completion."""

from __future__ import annotations

import json

import openai
import pytest
from gateway_helpers import (
    FAKE_REPLY,
    assert_error_shape,
    bearer,
    completion_record,
    http_client,
    openai_client,
    read_session,
)
from openai.types.responses import Response

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def validated(response: Response) -> Response:
    return Response.model_validate(response.model_dump(exclude_unset=True))


def test_string_input_is_answered_and_recorded(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    response = validated(
        openai_client(fake_gateway, key).responses.create(
            model="default", input="What is 2+2?", max_output_tokens=64, temperature=0.5
        )
    )
    assert response.id.startswith("resp_") and response.status == "completed"
    assert response.output_text == FAKE_REPLY
    [item] = response.output
    assert item.type == "message" and item.role == "assistant"
    assert response.usage.output_tokens > 0

    record = completion_record(fake_gateway, session_id, response.id)
    assert record["endpoint"] == "responses" and record["parent_id"] is None
    assert record["prompt_ids"] and record["prompt_tokens"] == len(record["prompt_ids"])
    assert record["output_ids"] and len(record["output_logprobs"]) == len(record["output_ids"])
    assert len(record["output_versions"]) == len(record["output_ids"])
    assert record["response"]["output"][0]["content"][0]["text"] == FAKE_REPLY
    assert "What is 2+2?" in tokenizer.decode(record["prompt_ids"])
    _, params = fake_gateway.engine.calls[-1]
    assert params.temperature == 0.5 and params.max_new_tokens == 64


def test_list_input_with_instructions(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    response = openai_client(fake_gateway, key).responses.create(
        model="default",
        instructions="You are terse.",
        input=[
            {"role": "user", "content": "Hi"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello!"}],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "What is 2+2?"}]},
        ],
        store=False,
        metadata={"x": "y"},
    )
    validated(response)
    prompt = tokenizer.decode(
        completion_record(fake_gateway, session_id, response.id)["prompt_ids"]
    )
    assert prompt.startswith("<|im_start|>system\nYou are terse.")
    assert prompt.index("Hello!") < prompt.index("What is 2+2?")


def test_tool_call_round_trip_links_to_the_first_response(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    fake_gateway.engine.script(HERMES_CALL, "It is 22 degrees in Paris.")
    question = [{"role": "user", "content": "What is the weather in Paris?"}]

    first = validated(client.responses.create(model="default", input=question, tools=[WEATHER]))
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments) == {"city": "Paris"}

    second = validated(
        client.responses.create(
            model="default",
            input=[
                *question,
                call.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": call.call_id, "output": "22 C"},
            ],
            tools=[WEATHER],
        )
    )
    assert second.output_text == "It is 22 degrees in Paris."
    rec1 = completion_record(fake_gateway, session_id, first.id)
    rec2 = completion_record(fake_gateway, session_id, second.id)
    assert rec1["finish_reason"] == "tool_calls"
    assert "<tools>" in tokenizer.decode(rec1["prompt_ids"])
    assert rec2["parent_id"] == first.id
    assert rec2["tokens_continue_parent"] is True
    assert "22 C" in tokenizer.decode(rec2["prompt_ids"])


def test_previous_response_id_only_within_the_own_session(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    _, other_key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    first = client.responses.create(model="default", input="Remember: 7.")
    second = client.responses.create(
        model="default", input="What did I say?", previous_response_id=first.id
    )
    third = client.responses.create(
        model="default", input="And again?", previous_response_id=second.id
    )
    rec2 = completion_record(fake_gateway, session_id, second.id)
    rec3 = completion_record(fake_gateway, session_id, third.id)
    assert rec2["parent_id"] == first.id and rec3["parent_id"] == second.id
    prompt = tokenizer.decode(rec3["prompt_ids"])
    assert prompt.index("Remember: 7.") < prompt.index("What did I say?") < prompt.index("And")
    assert rec3["tokens_continue_parent"] is True

    with pytest.raises(openai.NotFoundError):
        openai_client(fake_gateway, other_key).responses.create(
            model="default", input="Hi", previous_response_id=first.id
        )
    with http_client() as http:
        r = http.post(
            f"{fake_gateway.url}/responses",
            headers=bearer(other_key),
            json={"model": "default", "input": "Hi", "previous_response_id": first.id},
        )
        assert assert_error_shape(r, 404)["param"] == "previous_response_id"
        r = http.post(
            f"{fake_gateway.url}/responses",
            headers=bearer(key),
            json={"input": "Hi", "previous_response_id": "resp_unknown"},
        )
        assert_error_shape(r, 404)


def test_reward_by_response_id(fake_gateway, new_session):
    session_id, key = new_session(fake_gateway)
    response = openai_client(fake_gateway, key).responses.create(model="default", input="Hi")
    with http_client() as http:
        r = http.post(
            f"{fake_gateway.url}/rewards",
            headers=bearer(key),
            json={"completion_id": response.id, "reward": 0.5},
        )
    assert r.status_code == 200, r.text
    rewards = {c["id"]: c["reward"] for c in read_session(fake_gateway, session_id)["completions"]}
    assert rewards == {response.id: 0.5}


def test_streamed_text_event_order(fake_gateway, new_session):
    session_id, key = new_session(fake_gateway)
    events = list(
        openai_client(fake_gateway, key).responses.create(
            model="default", input="What is 2+2?", stream=True
        )
    )
    types = [e.type for e in events]
    deltas = [i for i, t in enumerate(types) if t == "response.output_text.delta"]
    assert deltas and types[: deltas[0]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[deltas[-1] + 1 :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(events[i].delta for i in deltas) == FAKE_REPLY
    final = validated(events[-1].response)
    assert final.output_text == FAKE_REPLY and final.usage.output_tokens > 0
    # The record is committed before response.completed.
    record = completion_record(fake_gateway, session_id, final.id)
    assert record["request"]["stream"] is True
    assert record["response"]["output"][0]["content"][0]["text"] == FAKE_REPLY


def test_streamed_tool_call_events(fake_gateway, new_session):
    session_id, key = new_session(fake_gateway)
    fake_gateway.engine.script(HERMES_CALL)
    events = list(
        openai_client(fake_gateway, key).responses.create(
            model="default", input="Weather in Paris?", tools=[WEATHER], stream=True
        )
    )
    types = [e.type for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2].item.type == "function_call" and events[2].item.arguments == ""
    done = events[5].item
    assert done.name == "get_weather" and json.loads(done.arguments) == {"city": "Paris"}
    final = validated(events[-1].response)
    assert final.output[0].call_id == done.call_id
    record = completion_record(fake_gateway, session_id, final.id)
    assert record["finish_reason"] == "tool_calls"
    assert record["response"]["output"][0]["call_id"] == done.call_id


@pytest.mark.parametrize("stream", [False, True])
def test_a_retry_is_answered_from_the_record(fake_gateway, new_session, stream):
    session_id, key = new_session(fake_gateway)
    body = {"model": "default", "input": "What is 2+2?", "stream": stream}
    with http_client() as http:
        first = http.post(f"{fake_gateway.url}/responses", headers=bearer(key), json=body)
        retry = http.post(
            f"{fake_gateway.url}/responses",
            headers={**bearer(key), "x-stainless-retry-count": "1"},
            json=body,
        )
    assert first.status_code == retry.status_code == 200
    [record] = read_session(fake_gateway, session_id)["completions"]
    if stream:
        assert f'"id":"{record["id"]}"' in retry.text
        assert retry.text.count("event: response.completed") == 1
    else:
        assert retry.json()["id"] == first.json()["id"] == record["id"]


def test_a_resent_input_history_is_parsed_only_where_new_and_recorded_as_sent(
    fake_gateway, new_session
):
    """An agent that resends its whole `input` list each turn (the Agents SDK without
    previous_response_id): from the second turn on the body is parsed on its previous
    one (incremental_body.py), and every turn records exactly the input it sent."""
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    bodies = fake_gateway.app.state.gateway.bodies
    min_bytes, bodies.min_bytes = bodies.min_bytes, 0  # (these bodies are small)
    reused, whole = bodies.reused, bodies.whole
    items: list[dict] = [{"role": "system", "content": "You help. " * 20}]
    sent, ids = [], []
    try:
        for turn in range(6):
            items.append({"role": "user", "content": f"Step {turn}: " + "a b c " * 30})
            reply = client.responses.create(model="default", input=items, instructions="Be brief.")
            sent.append([dict(i) for i in items])
            ids.append(reply.id)
            items.append({
                "type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": reply.output_text}],
            })  # fmt: skip
    finally:
        bodies.min_bytes = min_bytes
    assert bodies.reused - reused == 5 and bodies.whole - whole == 1
    for cid, expected in zip(ids, sent, strict=True):
        assert completion_record(fake_gateway, session_id, cid)["request"]["input"] == expected
