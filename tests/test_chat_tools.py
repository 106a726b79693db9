"""Tool calls: tools reach the prompt, calls are parsed out, and conversations link up."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from gateway_helpers import TIME, WEATHER, bearer, completion_record, openai_client, read_session

from gateway.chat.events import ContentEvent, ToolCallEvent
from gateway.chat.families.hermes import HermesToolParser as ToolCallParser

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def metric(gateway, name: str) -> float:
    text = httpx.get(f"{gateway.url.removesuffix('/v1')}/metrics").text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_tool_call_round_trip_links_and_continues_tokens(fake_gateway, new_session, tokenizer):
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    fake_gateway.engine.script(HERMES_CALL, "It is 22 degrees in Paris.")

    first = client.chat.completions.create(
        model="default", messages=QUESTION, tools=[WEATHER, TIME]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    messages = [
        *QUESTION,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 C, sunny"},
    ]
    second = client.chat.completions.create(
        model="default", messages=messages, tools=[WEATHER, TIME]
    )
    assert second.choices[0].message.content == "It is 22 degrees in Paris."
    assert second.choices[0].finish_reason == "stop"

    rec1 = completion_record(fake_gateway, session_id, first.id)
    rec2 = completion_record(fake_gateway, session_id, second.id)
    assert rec1["finish_reason"] == "tool_calls"
    assert rec1["response"]["message"]["tool_calls"][0]["id"] == call.id
    assert rec2["parent_id"] == first.id
    # The gateway writes the call back as the model wrote it: the tokens continue.
    assert rec2["tokens_continue_parent"] is True
    prompt = tokenizer.decode(rec2["prompt_ids"])
    assert "<tools>" in prompt and '"get_time"' in prompt
    assert "22 C, sunny" in prompt
    assert read_session(fake_gateway, session_id)["stats"]["token_prefix_mismatches"] == 0


def test_tools_are_described_to_a_template_without_tools(fake_gateway, new_session, tokenizer):
    """SmolLM2's template ignores `tools`; the gateway must not drop them silently."""
    assert "tools" not in tokenizer.chat_template
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    system = [{"role": "system", "content": "You are a weather bot."}]

    def prompt(**kwargs):
        answer = client.chat.completions.create(
            model="default", messages=system + QUESTION, **kwargs
        )
        return tokenizer.decode(
            completion_record(fake_gateway, session_id, answer.id)["prompt_ids"]
        )

    with_tools = prompt(tools=[WEATHER])
    assert with_tools.startswith("<|im_start|>system\nYou are a weather bot.\n\n# Tools")
    assert json.dumps(WEATHER["function"]["parameters"]) in with_tools
    assert "<tool_call>" in with_tools
    forced = prompt(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    assert "You must call the function `get_time`." in forced
    assert "You must call at least one function." in prompt(tools=[WEATHER], tool_choice="required")
    assert "<tools>" not in prompt(tools=[WEATHER], tool_choice="none")
    assert "<tools>" not in prompt()


def test_parallel_calls_in_hermes_blocks(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    fake_gateway.engine.script(
        "I will look both up.\n"
        + HERMES_CALL
        + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, tools=[WEATHER, TIME]
    )
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls"
    assert message.content == "I will look both up."
    assert [tc.function.name for tc in message.tool_calls] == ["get_weather", "get_time"]
    assert [json.loads(tc.function.arguments) for tc in message.tool_calls] == [
        {"city": "Paris"},
        {},
    ]
    assert len({tc.id for tc in message.tool_calls}) == 2


def test_smollm2_list_format_is_parsed(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    fake_gateway.engine.script(
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "get_time", "arguments": {}}]</tool_call>'
    )
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, tools=[WEATHER, TIME]
    )
    calls = answer.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert answer.choices[0].finish_reason == "tool_calls"


def test_unparseable_tool_json_comes_back_as_content_and_is_counted(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    fake_gateway.engine.script(broken)
    before = metric(fake_gateway, "turnstile_tool_call_parse_failures_total")
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, tools=[WEATHER]
    )
    assert answer.choices[0].message.content == broken
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"
    assert metric(fake_gateway, "turnstile_tool_call_parse_failures_total") == before + 1


def test_without_tools_tool_call_text_is_plain_content(fake_gateway, new_session):
    _, key = new_session(fake_gateway)
    fake_gateway.engine.script(HERMES_CALL)
    answer = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION
    )
    assert answer.choices[0].message.content == HERMES_CALL
    assert answer.choices[0].message.tool_calls is None


def test_streamed_tool_call_deltas(fake_gateway, new_session):
    session_id, key = new_session(fake_gateway)
    fake_gateway.engine.script("Checking.\n" + HERMES_CALL)
    stream = openai_client(fake_gateway, key).chat.completions.create(
        model="default", messages=QUESTION, tools=[WEATHER], stream=True
    )
    chunks = [c for c in stream if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content.strip() == "Checking."
    deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    head, *rest = deltas
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.name == "get_weather" and head.function.arguments == ""
    assert all(d.index == 0 and d.id is None for d in rest)
    assert json.loads("".join(d.function.arguments for d in rest)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in content and "<tool" not in content
    rec = completion_record(fake_gateway, session_id, chunks[0].id)
    assert rec["response"]["message"]["tool_calls"][0]["id"] == head.id
    assert rec["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    "content",
    ["<missing>", None, "", [], [{"type": "text", "text": ""}]],
    ids=["missing", "null", "empty", "no-parts", "empty-part"],
)
def test_assistant_tool_call_message_shapes_all_link(fake_gateway, new_session, http, content):
    session_id, key = new_session(fake_gateway)
    url = f"{fake_gateway.url}/chat/completions"
    fake_gateway.engine.script(HERMES_CALL)
    first = http.post(url, headers=bearer(key), json={"messages": QUESTION, "tools": [WEATHER]})
    call = first.json()["choices"][0]["message"]["tool_calls"][0]
    assistant = {"role": "assistant", "tool_calls": [call]}
    if content != "<missing>":
        assistant["content"] = content
    messages = [
        *QUESTION,
        assistant,
        {"role": "tool", "tool_call_id": call["id"], "content": "9 C"},
    ]
    second = http.post(url, headers=bearer(key), json={"messages": messages, "tools": [WEATHER]})
    assert second.status_code == 200, second.text
    rec = completion_record(fake_gateway, session_id, second.json()["id"])
    assert rec["parent_id"] == first.json()["id"]
    assert rec["tokens_continue_parent"] is True


def test_assistant_text_and_parts_are_rendered(fake_gateway, new_session, tokenizer, http):
    session_id, key = new_session(fake_gateway)
    messages = [
        *QUESTION,
        {"role": "assistant", "content": [{"type": "text", "text": "Let me think."}]},
        {"role": "user", "content": "Well?"},
    ]
    r = http.post(
        f"{fake_gateway.url}/chat/completions", headers=bearer(key), json={"messages": messages}
    )
    assert r.status_code == 200
    prompt = tokenizer.decode(
        completion_record(fake_gateway, session_id, r.json()["id"])["prompt_ids"]
    )
    assert "<|im_start|>assistant\nLet me think.<|im_end|>" in prompt


@pytest.mark.parametrize(
    "extra,code",
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "unknown_tool",
        ),
        ({"tool_choice": "required"}, "tool_choice_without_tools"),
    ],
    ids=["unknown-function", "required-without-tools"],
)
def test_impossible_tool_choice_is_422(fake_gateway, new_session, extra, code):
    _, key = new_session(fake_gateway)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        openai_client(fake_gateway, key).chat.completions.create(
            model="default", messages=QUESTION, **extra
        )
    assert info.value.code == code
    assert info.value.response.headers["x-should-retry"] == "false"
    assert fake_gateway.engine.calls == []


# ---- the parser on its own ---------------------------------------------------------------
def feed_in_pieces(text: str, size: int) -> tuple[ToolCallParser, list]:
    parser = ToolCallParser()
    events = []
    for i in range(0, len(text), size):
        events += parser.feed(text[i : i + size])
    events += parser.finish()
    return parser, events


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_parser_gives_the_same_calls_however_the_text_is_cut(size):
    text = "Sure.\n" + HERMES_CALL + "\n" + HERMES_CALL.replace("Paris", "Rome")
    parser, events = feed_in_pieces(text, size)
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    content = "".join(e.text for e in events if isinstance(e, ContentEvent))
    assert content == "Sure."  # no tag fragments, no whitespace around calls
    assert parser.content == "Sure."


def test_parser_holds_back_a_possible_tag_then_releases_it():
    parser = ToolCallParser()
    assert parser.feed("a <tool") == [ContentEvent("a")]
    assert parser.feed("box> b ") == [ContentEvent(" <toolbox> b")]
    assert parser.finish() == [ContentEvent(" ")]  # no call came: nothing is lost
    assert parser.content == "a <toolbox> b "


def test_parser_accepts_a_call_the_model_did_not_close():
    parser, events = feed_in_pieces('<tool_call>\n{"name": "get_time", "arguments": {}}', 5)
    assert [e.call.name for e in events if isinstance(e, ToolCallEvent)] == ["get_time"]
    assert parser.failures == 0


@pytest.mark.parametrize("stream", [False, True])
def test_replies_validate_as_the_openai_types(fake_gateway, new_session, stream):
    """The replies are built as plain dicts; they must still be exactly the API's shapes
    (validated, not just constructed, by the openai package's pydantic models)."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    _, key = new_session(fake_gateway)
    fake_gateway.engine.script(HERMES_CALL)
    body = {
        "messages": QUESTION,
        "tools": [WEATHER, TIME],
        "logprobs": True,
        "top_logprobs": 2,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    r = httpx.post(
        f"{fake_gateway.url}/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={k: v for k, v in body.items() if v is not None},
        timeout=30,
    )
    assert r.status_code == 200
    if not stream:
        reply = ChatCompletion.model_validate(r.json(), strict=False)
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and reply.usage.total_tokens > 0
        assert all(len(e.top_logprobs) == 2 for e in reply.choices[0].logprobs.content)
        return
    frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(f)) for f in frames[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    names = [
        tc.function.name for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []
    ]
    assert "get_weather" in names
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
