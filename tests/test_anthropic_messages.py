"""`POST /v1/messages`: the Anthropic Messages API, served and recorded like a chat turn.

Requests are shaped as Claude Code and the anthropic SDK send them (observed against a
logging server: `?beta=true`, `x-api-key`, system blocks with `cache_control`, a
system-role message inside `messages`, huge `max_tokens`, `thinking`, `metadata`...).
The real clients themselves run in tests/clients.
"""

from __future__ import annotations

import json

import pytest
from anthropic_helpers import (
    BASH,
    anthropic_headers,
    assert_anthropic_error,
    post_messages,
    root,
    sse_events,
)
from gateway_helpers import FAKE_REPLY, admin_headers, completion_record, read_session

from gateway.entrypoints.anthropic.errors import anthropic_error
from gateway.errors import APIError

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
# what Claude Code sends besides the messages (trimmed)
CLAUDE_CODE_FIELDS = {
    "system": [
        {"type": "text", "text": "You are a CLI agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief."},
    ],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "user_abc"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": []},
    "temperature": 1,
}
# A call as the model writes it; Claude Code sends its input back re-serialised.
CALL_TEXT = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -l été", "timeout": 120000.0}}'
    "\n</tool_call>"
)
ESCAPED_CALL_TEXT = CALL_TEXT.replace("été", "\\u00e9t\\u00e9").replace(": ", ":")


def test_claude_code_request_is_answered_and_recorded(fake_gateway, new_session, http, tokenizer):
    session_id, key = new_session(fake_gateway)
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
            {"role": "system", "content": "Mind the user's mood."},
        ],
        **CLAUDE_CODE_FIELDS,
        "unknown_field": {"any": "thing"},
    }
    r = post_messages(http, fake_gateway.url, key, body, "/v1/messages?beta=true")
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["id"].startswith("msg_") and msg["type"] == "message"
    assert msg["role"] == "assistant" and msg["model"] == "claude-sonnet-4-5"
    assert msg["content"] == [{"type": "text", "text": FAKE_REPLY}]
    assert msg["stop_reason"] == "end_turn" and msg["stop_sequence"] is None
    record = completion_record(fake_gateway, session_id, msg["id"])
    assert msg["usage"]["input_tokens"] == len(record["prompt_ids"])
    assert msg["usage"]["output_tokens"] == len(record["output_ids"])
    assert record["endpoint"] == "messages" and not record["side_request"]
    prompt = tokenizer.decode(record["prompt_ids"])
    assert "You are a CLI agent.\n\nBe brief." in prompt and "Mind the user's mood." in prompt
    assert "What is 2+2?" in prompt
    # max_tokens 32000 does not fit SmolLM2's context: clamped and recorded, never a 400
    _, params = fake_gateway.engine.calls[-1]
    assert params.max_new_tokens == 8192 - len(record["prompt_ids"])
    assert record["request"]["max_tokens_clamped_to"] == params.max_new_tokens
    assert record["request"]["max_tokens"] == 32000


def test_stream_sends_the_full_event_sequence(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    body = {"model": "m", "max_tokens": 64, "messages": QUESTION, "stream": True}
    headers = anthropic_headers(key, how="bearer")  # as the anthropic SDK authenticates
    r = http.post(f"{root(fake_gateway.url)}/v1/messages", headers=headers, json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    names = [name for name, _ in events]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["usage"]["input_tokens"] > 0 and start["stop_reason"] is None
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == FAKE_REPLY
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    record = completion_record(fake_gateway, session_id, start["id"])
    assert delta["usage"]["output_tokens"] == len(record["output_ids"])
    assert delta["usage"]["input_tokens"] == len(record["prompt_ids"])


@pytest.mark.parametrize(
    ("stream", "prompt_mode", "call_text"),
    [
        (False, "template", CALL_TEXT),
        (True, "template", CALL_TEXT),
        (False, "token_exact", ESCAPED_CALL_TEXT),
        (True, "token_exact", ESCAPED_CALL_TEXT),
    ],
    ids=["whole", "streamed", "whole-token_exact", "streamed-token_exact"],
)
def test_tool_round_trip_continues_the_generated_tokens(
    fake_gateway, new_session, http, tokenizer, stream, prompt_mode, call_text
):
    """The client sends the tool input back re-serialised (Claude Code re-dumps it: key
    order, `120000.0` -> `120000`, escapes): the next turn is still found to continue
    the answer, by its tool_use id, and its prompt continues the exact tokens generated
    (token_exact prompts: whatever the model wrote; template prompts: where the
    template writes the call as the model did)."""
    session_id, key = new_session(fake_gateway, prompt_mode=prompt_mode)
    fake_gateway.engine.script(call_text, "It lists one file.")
    body = {"model": "m", "max_tokens": 200, "messages": QUESTION, "tools": [BASH]}
    if stream:
        r = post_messages(http, fake_gateway.url, key, {**body, "stream": True})
        events = sse_events(r.text)
        [(_, start)] = [e for e in events if e[0] == "content_block_start"]
        block = start["content_block"]
        assert block["type"] == "tool_use" and block["input"] == {}
        [(_, delta)] = [e for e in events if e[0] == "content_block_delta"]
        assert delta["delta"]["type"] == "input_json_delta"
        arguments = json.loads(delta["delta"]["partial_json"])
        assert [e[0] for e in events].count("content_block_stop") == 1
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        msg_id = events[0][1]["message"]["id"]
        tool_id = block["id"]
    else:
        msg = post_messages(http, fake_gateway.url, key, body).json()
        assert msg["stop_reason"] == "tool_use"
        [block] = msg["content"]
        arguments, msg_id, tool_id = block["input"], msg["id"], block["id"]
    assert arguments == {"command": "ls -l été", "timeout": 120000.0}
    assert tool_id.startswith("toolu_")

    # Sent back as Claude Code does: other key order, 120000.0 -> 120000, no escapes.
    echoed = {"timeout": 120000, "command": "ls -l été"}
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": tool_id, "name": "Bash", "input": echoed}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool_id, "content": "a.txt"},
                {"type": "text", "text": "Summarise it."},
            ],
        },
    ]
    second = post_messages(http, fake_gateway.url, key, {**body, "messages": history}).json()
    assert second["content"] == [{"type": "text", "text": "It lists one file."}]
    first_rec = completion_record(fake_gateway, session_id, msg_id)
    second_rec = completion_record(fake_gateway, session_id, second["id"])
    assert second_rec["parent_id"] == msg_id and second_rec["tokens_continue_parent"]
    n = len(first_rec["prompt_ids"]) + len(first_rec["output_ids"])
    assert second_rec["prompt_ids"][:n] == first_rec["prompt_ids"] + first_rec["output_ids"]
    prompt = tokenizer.decode(second_rec["prompt_ids"][n:])
    assert "a.txt" in prompt and "Summarise it." in prompt
    metrics = http.get(f"{root(fake_gateway.url)}/metrics").text
    assert "turnstile_tool_inputs_restored_total 1" in metrics


def test_tool_input_is_restored_from_the_record_after_a_restart(
    gateway_factory, new_session, http, tmp_path
):
    """The generated arguments are kept with the answer's record, not only in memory."""
    gw = gateway_factory()
    session_id, key = new_session(gw)
    gw.engine.script(CALL_TEXT)
    body = {"model": "m", "max_tokens": 200, "messages": QUESTION, "tools": [BASH]}
    msg = post_messages(http, gw.url, key, body).json()
    tool_id = msg["content"][0]["id"]
    serving = next(iter(h for h in gw.state.handlers.values() if hasattr(h, "_arguments")))
    # as after a restart: only the database knows
    assert serving._arguments.pop((session_id, msg["id"])) is not None
    echoed = {"timeout": 120000, "command": "ls -l été"}
    history = [
        *QUESTION,
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": tool_id, "name": "Bash", "input": echoed},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id, "is_error": True,
             "content": [{"type": "text", "text": "ls: no such file"}]},
        ]},
    ]  # fmt: skip
    second = post_messages(http, gw.url, key, {**body, "messages": history}).json()
    record = completion_record(gw, session_id, second["id"])
    assert record["parent_id"] == msg["id"] and record["tokens_continue_parent"]


def test_stop_reasons(fake_gateway, new_session, http):
    _, key = new_session(fake_gateway)
    body = {"model": "m", "messages": QUESTION}
    msg = post_messages(http, fake_gateway.url, key, {**body, "max_tokens": 2}).json()
    assert msg["stop_reason"] == "max_tokens" and msg["usage"]["output_tokens"] == 2
    fake_gateway.engine.script("The answer is 4. STOP and more")
    msg = post_messages(
        http, fake_gateway.url, key, {**body, "max_tokens": 50, "stop_sequences": ["STOP"]}
    ).json()
    assert msg["stop_reason"] == "stop_sequence" and msg["stop_sequence"] == "STOP"
    assert msg["content"][0]["text"] == "The answer is 4. "


def test_thinking_blocks_from_the_reasoning_parser(gateway_factory, new_session, http):
    """A reasoning model's reasoning comes back as a signed thinking block; sent back,
    the gateway knows it as its own."""
    gw = gateway_factory({"reasoning_parser": "qwen3"})
    session_id, key = new_session(gw)
    gw.engine.script("<think>Add them.</think>4", "<think>Done.</think>Yes.")
    body = {"model": "m", "max_tokens": 64, "messages": QUESTION, "stream": True}
    events = sse_events(post_messages(http, gw.url, key, body).text)
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert deltas[0] == {"type": "thinking_delta", "thinking": "Add them."}
    assert deltas[1]["type"] == "signature_delta" and deltas[1]["signature"]
    assert deltas[2] == {"type": "text_delta", "text": "4"}
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert [n for n, _ in events].count("content_block_stop") == 2
    msg_id = events[0][1]["message"]["id"]
    record = completion_record(gw, session_id, msg_id)
    thinking, text = record["response"]["message"]["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": "Add them.",
        "signature": deltas[1]["signature"],
    }
    assert text == {"type": "text", "text": "4"}

    history = [*QUESTION, {"role": "assistant", "content": [thinking, text]},
               {"role": "user", "content": "Sure?"}]  # fmt: skip
    second = post_messages(http, gw.url, key, {**body, "messages": history, "stream": False})
    assert second.json()["content"][0]["type"] == "thinking"
    assert completion_record(gw, session_id, second.json()["id"])["parent_id"] == msg_id
    forged = {**thinking, "signature": "x"}  # not the gateway's: dropped, not an error
    history[1] = {"role": "assistant", "content": [forged, {"type": "redacted_thinking",
                                                             "data": "abc"}, text]}  # fmt: skip
    gw.engine.script("Yes.")
    r = post_messages(http, gw.url, key, {**body, "messages": history, "stream": False})
    assert r.status_code == 200, r.text


def test_count_tokens_is_the_prompt_generated_from(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    body = {"model": "m", "messages": QUESTION, "tools": [BASH], **CLAUDE_CODE_FIELDS}
    r = post_messages(http, fake_gateway.url, key, body, "/v1/messages/count_tokens")
    assert r.status_code == 200, r.text
    counted = r.json()["input_tokens"]
    msg = post_messages(http, fake_gateway.url, key, {**body, "max_tokens": 16}).json()
    assert counted == msg["usage"]["input_tokens"]
    assert counted == len(completion_record(fake_gateway, session_id, msg["id"])["prompt_ids"])


def test_errors_are_in_anthropic_shape(fake_gateway, new_session, http):
    _, key = new_session(fake_gateway)
    url = fake_gateway.url
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    r = post_messages(http, url, key, {"model": "m", "max_tokens": 8,
                                      "messages": [{"role": "user", "content": [image]}]})  # fmt: skip
    assert "image" in assert_anthropic_error(r, 400, "invalid_request_error")["message"]
    r = post_messages(http, url, key, {"model": "m", "messages": QUESTION})  # no max_tokens
    assert "max_tokens" in assert_anthropic_error(r, 400, "invalid_request_error")["message"]
    r = http.post(f"{root(url)}/v1/messages", headers=anthropic_headers(key), content=b"{not json")
    assert_anthropic_error(r, 400, "invalid_request_error")
    r = post_messages(http, url, key, {"model": "m", "max_tokens": 8, "messages": QUESTION,
                                      "tool_choice": {"type": "tool", "name": "nope"},
                                      "tools": [BASH]})  # fmt: skip
    assert "nope" in assert_anthropic_error(r, 400, "invalid_request_error")["message"]
    r = post_messages(http, url, "tsk-wrong", {"model": "m", "max_tokens": 8, "messages": QUESTION})
    assert_anthropic_error(r, 401, "authentication_error")
    r = post_messages(http, url, key, {"model": "m", "messages": QUESTION}, "/v1/messages/nope")
    assert_anthropic_error(r, 404, "not_found_error")
    r = post_messages(http, url, key, {"model": "m", "max_tokens": 8, "messages": QUESTION},
                      "/v1/messages/count_tokens")  # fmt: skip
    assert r.status_code == 200  # unknown fields (max_tokens here) are ignored
    # the OpenAI routes keep OpenAI's shape
    r = http.post(f"{url}/chat/completions", headers=anthropic_headers(key), json={})
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_engine_down_is_overloaded_529_then_recovers(fake_gateway, new_session, http):
    _, key = new_session(fake_gateway)
    body = {"model": "m", "max_tokens": 8, "messages": QUESTION}
    fake_gateway.engine.alive = False
    for stream in (False, True):
        r = post_messages(http, fake_gateway.url, key, {**body, "stream": stream})
        assert_anthropic_error(r, 529, "overloaded_error")
        assert r.headers["retry-after"] and r.headers["x-should-retry"] == "true"
    fake_gateway.engine.alive = True
    assert post_messages(http, fake_gateway.url, key, body).status_code == 200


def test_full_gateway_is_overloaded_529(gateway_factory, new_session, http):
    gw = gateway_factory({"max_pending_requests": 0})
    _, key = new_session(gw)
    r = post_messages(http, gw.url, key, {"model": "m", "max_tokens": 8, "messages": QUESTION})
    assert_anthropic_error(r, 529, "overloaded_error")
    assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize(
    ("status", "code", "want_status", "want_type"),
    [
        (403, None, 403, "permission_error"),
        (429, "rate_limited", 429, "rate_limit_error"),
        (500, "internal_error", 500, "api_error"),
        (503, "engine_timeout", 504, "timeout_error"),
        (422, "n_too_large", 400, "invalid_request_error"),
    ],
)
def test_gateway_errors_map_to_anthropic_types(status, code, want_status, want_type):
    err = anthropic_error(APIError(status, "m", code=code))
    assert err.status == want_status and err.body["error"]["type"] == want_type
    if want_status == 429:
        assert err.headers["retry-after"]


def test_side_requests_are_flagged_and_left_out_of_exports(fake_gateway, new_session, http):
    session_id, key = new_session(fake_gateway)
    url = fake_gateway.url
    main = post_messages(http, url, key, {"model": "claude-sonnet-4-5", "max_tokens": 16,
                                         "messages": QUESTION, "tools": [BASH]}).json()  # fmt: skip
    title = post_messages(http, url, key, {
        "model": "claude-sonnet-4-5", "max_tokens": 16, "messages": QUESTION,
        "system": [{"type": "text", "text": "Write a 3-7 word title for this conversation."}],
    }).json()  # fmt: skip
    small = post_messages(http, url, key, {"model": "claude-haiku-4-5", "max_tokens": 16,
                                          "messages": QUESTION}).json()  # fmt: skip
    flags = {
        c["id"]: c["side_request"] for c in read_session(fake_gateway, session_id)["completions"]
    }
    assert flags == {main["id"]: False, title["id"]: True, small["id"]: True}

    # rewards are set by the msg_ id
    r = http.post(f"{url}/rewards", headers=admin_headers(),
                  json={"rewards": {main["id"]: 1.0, small["id"]: 0.0}})  # fmt: skip
    assert r.status_code == 200, r.text
    export = f"{url}/sessions/{session_id}/export"
    samples = http.get(export, headers=admin_headers()).json()["samples"]
    assert [s["completion_ids"] for s in samples] == [[main["id"]]]
    assert samples[0]["reward"] == 1.0
    samples = http.get(export, headers=admin_headers(),
                       params={"include_side_requests": "true"}).json()["samples"]  # fmt: skip
    assert len(samples) == 3


@pytest.mark.slow
def test_real_smollm2_answers_whole_and_streamed(embedded_gateway, new_session, http, tokenizer):
    """The real engine: the streamed text and the whole answer are the recorded tokens."""
    session_id, key = new_session(embedded_gateway, sampling={"temperature": 0.0})
    url = embedded_gateway.url
    body = {"model": "m", "max_tokens": 12, "messages": QUESTION, "system": "Be brief."}
    whole = post_messages(http, url, key, body).json()
    events = sse_events(post_messages(http, url, key, {**body, "stream": True}).text)
    streamed = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert whole["content"][0]["text"] == streamed  # greedy: the same answer twice
    assert events[-1][0] == "message_stop"
    for msg_id, text in ((whole["id"], streamed), (events[0][1]["message"]["id"], streamed)):
        record = completion_record(embedded_gateway, session_id, msg_id)
        assert tokenizer.decode(record["output_ids"], skip_special_tokens=True) == text
        assert len(record["output_logprobs"]) == len(record["output_ids"]) <= 12
    counted = post_messages(http, url, key, body, "/v1/messages/count_tokens").json()
    assert counted["input_tokens"] == whole["usage"]["input_tokens"]


def test_cli_export_leaves_side_requests_out_unless_asked(
    fake_gateway, new_session, http, tmp_path
):
    from trainer.cli import main as turnstile

    session_id, key = new_session(fake_gateway)
    url = fake_gateway.url
    main = post_messages(http, url, key, {"model": "big", "max_tokens": 8, "messages": QUESTION})
    side = post_messages(http, url, key, {"model": "small", "max_tokens": 8, "messages": QUESTION})
    ids = [main.json()["id"], side.json()["id"]]
    r = http.post(f"{url}/rewards", headers=admin_headers(),
                  json={"rewards": {i: 1.0 for i in ids}})  # fmt: skip
    assert r.status_code == 200, r.text
    database, out = fake_gateway.config.database, tmp_path / "samples.jsonl"
    assert turnstile(["export", "--database", database, "--out", str(out)]) == 0
    assert [json.loads(line)["completion_ids"] for line in out.open()] == [ids[:1]]
    args = ["export", "--database", database, "--out", str(out), "--include-side-requests"]
    assert turnstile(args) == 0
    assert sorted(json.loads(line)["completion_ids"][0] for line in out.open()) == sorted(ids)


def test_error_mid_stream_is_an_anthropic_error_event(gateway_factory, new_session, http):
    """An engine that stalls after the stream began: the open block is followed by an
    `error` event in Anthropic's shape (the SDKs raise it), not a hang."""
    gw = gateway_factory(token_delay_s=0.1, config={"request_timeout_s": 0.6})
    gw.engine.script("one two three four five six seven eight nine ten eleven twelve " * 3)
    _, key = new_session(gw)
    body = {"model": "m", "max_tokens": 200, "messages": QUESTION, "stream": True}
    events = sse_events(post_messages(http, gw.url, key, body).text)
    assert events[0][0] == "message_start" and "content_block_delta" in [n for n, _ in events]
    name, data = events[-1]
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == "timeout_error" and "did not answer" in data["error"]["message"]


def test_a_long_history_is_converted_once_and_renders_as_a_whole_conversion(
    fake_gateway, new_session, http, tokenizer, monkeypatch
):
    """A Claude Code session resends its whole history each turn: each message is
    converted to chat form once (the memo in `MessagesServing.chat_of`), and every turn's
    prompt is still the template's render of the whole history converted afresh."""
    from gateway.chat.template import ChatRenderer
    from gateway.entrypoints.anthropic.messages import protocol as p_

    converted = []
    for name in ("_user", "_assistant"):
        real = getattr(p_, name)

        def counting(content, where, *rest, _real=real):  # type: ignore[no-untyped-def]
            converted.append(where)
            return _real(content, where, *rest)

        monkeypatch.setattr(p_, name, counting)
    bodies = fake_gateway.app.state.gateway.bodies
    min_bytes, bodies.min_bytes = bodies.min_bytes, 0  # (these bodies are small)
    session_id, key = new_session(fake_gateway)
    system = "You are an agent. " * 20
    history: list[dict] = [{"role": "user", "content": "Start."}]
    ids = []
    try:
        for turn in range(6):
            body = {"model": "claude", "max_tokens": 64, "system": system, "messages": history}
            reply = post_messages(http, fake_gateway.url, key, body).json()
            ids.append((reply["id"], [dict(m) for m in history]))
            history = [
                *history,
                {"role": "assistant", "content": reply["content"]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": "ok " * 40},
                    {"type": "text", "text": f"Go on {turn}."},
                ]},
            ]  # fmt: skip
    finally:
        bodies.min_bytes = min_bytes
    assert len(converted) == len(history) - 2  # each message once (the last two unsent)
    renderer = ChatRenderer(tokenizer)
    for cid, sent in ids:
        req = p_.MessagesRequest.model_validate({"model": "claude", "max_tokens": 64,
                                                 "system": system, "messages": sent})  # fmt: skip
        chat = p_.to_chat(req, lambda _: None, lambda _text, _sig: False)
        record = completion_record(fake_gateway, session_id, cid)
        expected = tokenizer.encode(renderer.render_text(chat), add_special_tokens=False)
        assert record["prompt_ids"] == expected
