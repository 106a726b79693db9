"""Each model family through the HTTP API, with its real tokenizer and chat template.

The engine answers with scripted token ids: what a model of that family writes (its
tool-call and reasoning format), encoded by its real tokenizer. Each family covers: a
two-turn tool round trip, whole and streamed; two parallel calls; a call with no
arguments; a call that does not parse (returned as text, counted); reasoning split off;
the next turn rendered back through the template; the recorded ids being the engine's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from family_helpers import FAMILIES, Family, family_tokenizer
from gateway_helpers import (
    ADMIN_KEY,
    TIME,
    WEATHER,
    admin_headers,
    bearer,
    completion_record,
    http_client,
    openai_client,
    read_session,
)
from test_chat_tools import metric
from transformers.utils.chat_template_utils import render_jinja_template

import gateway.app
from gateway.config import GatewayConfig
from gateway.inference.fake import FakeEngine
from gateway.server import BackgroundGateway

TOOLS = [WEATHER, TIME]
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(params=sorted(FAMILIES))
def family(request) -> Family:
    return FAMILIES[request.param]


@pytest.fixture
def family_gateway(family, tmp_path, monkeypatch) -> Iterator[Callable[..., BackgroundGateway]]:
    """`family_gateway(**config) -> gateway` with the family's tokenizer and template."""
    tok = family_tokenizer(family.name)
    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tok)
    started: list[BackgroundGateway] = []

    def make(token_delay_s: float = 0.0, **overrides: Any) -> BackgroundGateway:
        engine = FakeEngine(
            reply_ids=tok.encode("OK", add_special_tokens=False),
            stop_id=int(tok.eos_token_id),
            encode=lambda text: tok.encode(text, add_special_tokens=False),
            token_delay_s=token_delay_s,
        )
        config = GatewayConfig(
            port=0,
            database=str(tmp_path / f"g{len(started)}.db"),
            admin_key=ADMIN_KEY,
            engine="fake",
            **{**family.config, **overrides},
        )
        gw = BackgroundGateway(config, engine=engine).start()
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()


def scripted_ids(family: Family, text: str) -> list[int]:
    """What the engine emits for `text`: its tokens, then the stop token."""
    tok = family_tokenizer(family.name)
    ids = tok.encode(text, add_special_tokens=False)
    if text.endswith("<|call|>"):  # harmony's call ends with its own stop token
        return ids
    return ids + [int(tok.eos_token_id)]


def ask(client, messages: list[dict[str, Any]], stream: bool, **kw: Any) -> dict[str, Any]:
    """One chat turn: (id, message dict, finish reason), whole or assembled from a stream."""
    if not stream:
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **kw)
        c = r.choices[0]
        return {
            "id": r.id,
            "message": c.message.model_dump(exclude_none=True),
            "finish": c.finish_reason,
        }
    message: dict[str, Any] = {"role": "assistant"}
    content, reasoning, calls, finish, cid = [], [], {}, None, None
    for chunk in client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, stream=True, **kw
    ):
        cid = chunk.id
        for c in chunk.choices:
            d = c.delta
            content.append(d.content or "")
            reasoning.append(getattr(d, "reasoning_content", None) or "")
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                call["name"] += (tc.function and tc.function.name) or ""
                call["arguments"] += (tc.function and tc.function.arguments) or ""
            finish = c.finish_reason or finish
    if "".join(content):
        message["content"] = "".join(content)
    if "".join(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for _, c in sorted(calls.items())
        ]
    return {"id": cid, "message": message, "finish": finish}


def calls_of(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
        for tc in message.get("tool_calls", [])
    ]


def expected_prompt(family: Family, messages: list[dict[str, Any]]) -> str:
    """The prompt the family's own template renders for these messages (the messages
    shaped as that template wants them), rendered here independently of the gateway."""
    tok = family_tokenizer(family.name)
    if family.name == "gptoss":
        return harmony_prompt(messages)
    shaped = []
    for m in messages:
        m = {
            k: v
            for k, v in m.items()
            if k in ("role", "content", "tool_calls", "tool_call_id", "reasoning_content")
        }
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                args = tc["function"]["arguments"]
                if family.name != "deepseek_v3":  # DeepSeek's template concatenates text
                    args = json.loads(args)
                # name first, as the model writes it (Mistral's template dumps the dict)
                calls.append(
                    {**tc, "function": {"name": tc["function"]["name"], "arguments": args}}
                )
            m["tool_calls"] = calls
            m.setdefault("content", None if family.name == "deepseek_v3" else "")
        if family.name != "qwen3":  # only Qwen3's template reads it
            m.pop("reasoning_content", None)
        shaped.append(m)
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
    if family.chat_template:
        kwargs["chat_template"] = family.chat_template
    if family.name == "deepseek_v3":
        # Its template shows no tools (the gateway's prompt does), and tells a tool-call
        # turn by `content is none`, a key apply_chat_template drops: render it as is.
        rendered, _ = render_jinja_template(
            conversations=[shaped],
            chat_template=tok.chat_template,
            add_generation_prompt=True,
            **tok.special_tokens_map,
        )
        return rendered[0]
    return tok.apply_chat_template(shaped, tools=TOOLS, **kwargs)


def harmony_prompt(messages: list[dict[str, Any]]) -> str:
    """What openai-harmony itself renders for these messages (gpt-oss's prompt)."""
    from openai_harmony import (
        Author,
        Conversation,
        DeveloperContent,
        HarmonyEncodingName,
        Message,
        Role,
        SystemContent,
        ToolDescription,
        load_harmony_encoding,
    )

    from gateway.chat.families.gpt_oss import encodings_dir  # the vocabulary, offline

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(encodings_dir(family_tokenizer("gptoss"))))
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    tools = [ToolDescription.new(**{**t["function"]}) for t in TOOLS]
    out = [
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new()),
        Message.from_role_and_content(
            Role.DEVELOPER,
            DeveloperContent.new()
            .with_instructions(messages[0]["content"])
            .with_function_tools(tools),
        ),
    ]
    names = {}
    for m in messages[1:]:
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "assistant":
            if m.get("reasoning_content"):
                out.append(
                    Message.from_role_and_content(
                        Role.ASSISTANT, m["reasoning_content"]
                    ).with_channel("analysis")
                )
            for tc in m.get("tool_calls", []):
                names[tc["id"]] = tc["function"]["name"]
                args = json.dumps(json.loads(tc["function"]["arguments"]))
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, args)
                    .with_channel("commentary")
                    .with_recipient("functions." + tc["function"]["name"])
                    .with_content_type("<|constrain|>json")
                )
            if m.get("content"):
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel(
                        "final"
                    )
                )
        else:
            author = Author.new(Role.TOOL, "functions." + names[m["tool_call_id"]])
            out.append(
                Message.from_author_and_content(author, m["content"])
                .with_channel("commentary")
                .with_recipient("assistant")
            )
    ids = enc.render_conversation_for_completion(Conversation.from_messages(out), Role.ASSISTANT)
    return enc.decode_utf8(ids)


def test_parsers_are_detected_from_the_template(family, family_gateway):
    generator = family_gateway().state.stages.generator
    assert generator.tool_parser_name == family.tool_parser
    assert generator.reasoning_parser_name == family.reasoning_parser


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_two_turn_tool_round_trip(family, family_gateway, new_session, stream):
    gw = family_gateway(token_delay_s=0.001 if stream else 0.0)
    session_id, key = new_session(gw)
    client = openai_client(gw, key)
    first_text = family.answer([("get_weather", {"city": "Paris"})], reasoning="Weather: ask.")
    second_text = family.answer(text="It is 22 C in Paris.", reasoning="Tool said 22 C.")
    gw.engine.script(first_text, second_text)

    first = ask(client, QUESTION, stream)
    assert first["finish"] == "tool_calls"
    assert calls_of(first["message"]) == [("get_weather", {"city": "Paris"})]
    assert not first["message"].get("content")
    if family.reasoning_parser:
        assert first["message"]["reasoning_content"] == "Weather: ask."

    call_id = first["message"]["tool_calls"][0]["id"]
    messages = [
        *QUESTION,
        first["message"],
        {"role": "tool", "tool_call_id": call_id, "content": "22 C, sunny"},
    ]
    second = ask(client, messages, stream)
    assert second["finish"] == "stop"
    assert second["message"]["content"] == "It is 22 C in Paris."
    if family.reasoning_parser:
        assert second["message"]["reasoning_content"] == "Tool said 22 C."

    rec1 = completion_record(gw, session_id, first["id"])
    rec2 = completion_record(gw, session_id, second["id"])
    assert rec1["output_ids"] == scripted_ids(family, first_text)  # reasoning included
    assert rec2["output_ids"] == scripted_ids(family, second_text)
    assert rec2["parent_id"] == first["id"]
    tok = family_tokenizer(family.name)
    prompt = tok.decode(rec2["prompt_ids"], skip_special_tokens=False)
    if family.name != "deepseek_v3":
        assert prompt == expected_prompt(family, messages)
    else:  # the gateway adds its tool prompt to the system message
        assert prompt.endswith(expected_prompt(family, messages).split("<｜User｜>", 1)[1])
    assert "22 C, sunny" in prompt and "get_weather" in prompt


def test_two_parallel_calls(family, family_gateway, new_session):
    gw = family_gateway()
    _, key = new_session(gw)
    client = openai_client(gw, key)
    calls = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    gw.engine.script(family.answer(calls, reasoning="Two cities."))
    for stream in (False, True):
        gw.engine.script(family.answer(calls, reasoning="Two cities."))
        out = ask(client, QUESTION, stream)
        if not family.parallel:  # the first call's stop token ends the answer
            assert calls_of(out["message"]) == calls[:1]
            continue
        assert calls_of(out["message"]) == calls
        ids = [tc["id"] for tc in out["message"]["tool_calls"]]
        assert len(set(ids)) == 2


def test_zero_argument_call_is_a_real_call(family, family_gateway, new_session):
    gw = family_gateway()
    session_id, key = new_session(gw)
    client = openai_client(gw, key)
    gw.engine.script(
        family.answer([("get_time", {})], reasoning="Time."),
        family.answer(text="Noon.", reasoning="ok"),
    )
    first = ask(client, QUESTION, stream=False)
    assert first["finish"] == "tool_calls"
    [(name, args)] = calls_of(first["message"])
    assert (name, args) == ("get_time", {})
    assert first["message"]["tool_calls"][0]["function"]["arguments"] == "{}"
    call_id = first["message"]["tool_calls"][0]["id"]
    messages = [
        *QUESTION,
        first["message"],
        {"role": "tool", "tool_call_id": call_id, "content": "12:00"},
    ]
    second = ask(client, messages, stream=False)
    rec2 = completion_record(gw, session_id, second["id"])
    prompt = family_tokenizer(family.name).decode(rec2["prompt_ids"])
    assert (
        "get_time" in prompt.split("What is the weather in Paris?")[-1]
    )  # the call, rendered back


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_malformed_call_comes_back_as_text_and_is_counted(
    family, family_gateway, new_session, stream
):
    gw = family_gateway(token_delay_s=0.001 if stream else 0.0)
    session_id, key = new_session(gw)
    client = openai_client(gw, key)
    before = metric(gw, "turnstile_tool_call_parse_failures_total")
    gw.engine.script(family.answer(reasoning="Try.") + family.malformed)
    out = ask(client, QUESTION, stream)
    assert out["finish"] == "stop"
    assert "tool_calls" not in out["message"]
    shown = family.shown_malformed or family.malformed
    assert out["message"]["content"].strip() == shown.strip()
    assert metric(gw, "turnstile_tool_call_parse_failures_total") == before + 1
    assert read_session(gw, session_id)["stats"]["tool_parse_failures"] == 1
    rec = completion_record(gw, session_id, out["id"])
    assert rec["diagnostics"]["tool_parse_failures"] == 1


QWEN3_ONLY = pytest.mark.parametrize("family", [FAMILIES["qwen3"]], ids=["qwen3"])


@QWEN3_ONLY
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_reasoning_item(family, family_gateway, new_session, stream):
    gw = family_gateway(token_delay_s=0.001 if stream else 0.0)
    session_id, key = new_session(gw)
    client = openai_client(gw, key)
    text = family.answer([("get_weather", {"city": "Paris"})], reasoning="Need the weather.")
    gw.engine.script(text)
    tools = [{"type": "function", **WEATHER["function"]}]
    if not stream:
        response = client.responses.create(model="m", input="Weather in Paris?", tools=tools)
    else:
        events = list(
            client.responses.create(model="m", input="Weather in Paris?", tools=tools, stream=True)
        )
        deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
        assert "".join(deltas) == "Need the weather."
        response = events[-1].response
    reasoning, call = response.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == "Need the weather."
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert completion_record(gw, session_id, response.id)["output_ids"] == scripted_ids(
        family, text
    )


@QWEN3_ONLY
def test_responses_reasoning_input_reaches_the_template(family, family_gateway, new_session):
    """A reasoning item sent back is the next assistant turn's reasoning_content."""
    gw = family_gateway()
    session_id, key = new_session(gw)
    client = openai_client(gw, key)
    gw.engine.script(family.answer(text="Sunny.", reasoning="Done."))
    response = client.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Ask the tool."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "22 C"},
        ],
        tools=[{"type": "function", **WEATHER["function"]}],
    )  # fmt: skip
    prompt = family_tokenizer("qwen3").decode(
        completion_record(gw, session_id, response.id)["prompt_ids"]
    )
    assert "<think>\nAsk the tool.\n</think>\n\n<tool_call>" in prompt


def three_turn_session(family: Family, gw: BackgroundGateway, key: str) -> list[str]:
    """Tool call, answer, then a new user question: the ids of the three turns."""
    client = openai_client(gw, key)
    gw.engine.script(
        family.answer([("get_weather", {"city": "Paris"})], reasoning="Ask the tool."),
        family.answer(text="It is 22 C.", reasoning="The tool said 22 C."),
        family.answer(text="You are welcome.", reasoning="Polite."),
    )
    first = ask(client, QUESTION, stream=False)
    call_id = first["message"]["tool_calls"][0]["id"]
    messages = [
        *QUESTION,
        first["message"],
        {"role": "tool", "tool_call_id": call_id, "content": "22 C"},
    ]
    second = ask(client, messages, stream=False)
    third = ask(
        client, [*messages, second["message"], {"role": "user", "content": "Thanks!"}], False
    )
    return [first["id"], second["id"], third["id"]]


@QWEN3_ONLY
def test_drift_is_located_and_explained(family, family_gateway, new_session):
    """Qwen3's template drops the reasoning of answers before the last user turn: the
    third turn's prompt no longer extends the second's, and the record says where and why."""
    gw = family_gateway()
    session_id, key = new_session(gw)
    ids = three_turn_session(family, gw, key)
    recs = [completion_record(gw, session_id, i) for i in ids]
    assert recs[1]["tokens_continue_parent"] is True
    assert "drift" not in recs[1]["diagnostics"]
    assert recs[2]["parent_id"] == ids[1] and recs[2]["tokens_continue_parent"] is False
    found = recs[2]["diagnostics"]["drift"]
    assert found["cause"] == "reasoning_dropped"
    parent_tokens = recs[1]["prompt_ids"] + recs[1]["output_ids"]
    at = found["at"]
    assert recs[2]["prompt_ids"][:at] == parent_tokens[:at]
    assert recs[2]["prompt_ids"][at] != parent_tokens[at]
    stats = read_session(gw, session_id)["stats"]
    assert stats["token_prefix_mismatches"] == 1
    assert stats["drift_causes"] == {"reasoning_dropped": 1}
    assert metric(gw, "turnstile_prompt_drift_reasoning_dropped_total") == 1


def export_concat(gw: BackgroundGateway, session_id: str, key: str, ids: list[str]):
    """The session's `concat` samples, the last turn rewarded."""
    with http_client() as http:
        r = http.post(f"{gw.url}/rewards", headers=bearer(key), json={"rewards": {ids[-1]: 1}})
        assert r.status_code == 200, r.text
        r = http.get(
            f"{gw.url}/sessions/{session_id}/export",
            headers=admin_headers(),
            params={"style": "concat"},
        )
    assert r.status_code == 200, r.text
    return r.json()["samples"]


@QWEN3_ONLY
@pytest.mark.parametrize("where", ["session", "gateway"])
def test_token_exact_prompts_never_drift(family, family_gateway, new_session, where):
    """`prompt_mode: token_exact` (a session's choice, or the gateway's): every turn's prompt
    is its parent's prompt + output ids, then only the new messages, so the reasoning
    Qwen3's template would drop stays and the session is one concat sample."""
    gw = family_gateway(**({"prompt_mode": "token_exact"} if where == "gateway" else {}))
    chosen = {"prompt_mode": "token_exact"} if where == "session" else {}
    session_id, key = new_session(gw, **chosen)
    ids = three_turn_session(family, gw, key)
    recs = [completion_record(gw, session_id, i) for i in ids]
    modes = [r["diagnostics"]["prompt_mode"] for r in recs]
    assert modes == ["template", "token_exact", "token_exact"]
    for parent, child in zip(recs, recs[1:], strict=False):
        assert child["parent_id"] == parent["id"]
        before = parent["prompt_ids"] + parent["output_ids"]
        assert child["prompt_ids"][: len(before)] == before
        assert child["tokens_continue_parent"] is True
        assert "drift" not in child["diagnostics"]
        assert "prompt_mode_fallback" not in child["diagnostics"]
    tok = family_tokenizer(family.name)
    third = tok.decode(recs[2]["prompt_ids"], skip_special_tokens=False)
    assert "<think>\nThe tool said 22 C.\n</think>" in third  # what the template hides
    assert third.endswith("<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n")
    stats = read_session(gw, session_id)["stats"]
    assert stats["token_prefix_mismatches"] == 0 and stats["drift_causes"] == {}
    assert metric(gw, "turnstile_prompts_token_exact_built_total") == 2
    [sample] = export_concat(gw, session_id, key, ids)
    assert sample["completion_ids"] == ids
    assert sample["input_ids"] == recs[2]["prompt_ids"] + recs[2]["output_ids"]
    assert sample["meta"]["concat_fallbacks"] == 0


@QWEN3_ONLY
def test_template_prompts_are_the_default_and_recorded_nowhere(family, family_gateway, new_session):
    gw = family_gateway()
    session_id, key = new_session(gw)
    assert read_session(gw, session_id)["prompt_mode"] is None  # the gateway's default
    ids = three_turn_session(family, gw, key)
    recs = [completion_record(gw, session_id, i) for i in ids]
    assert all("prompt_mode" not in r["diagnostics"] for r in recs)
    assert len(export_concat(gw, session_id, key, ids)) == 2  # the drift splits it


@QWEN3_ONLY
def test_a_session_may_choose_template_prompts(family, family_gateway, new_session):
    gw = family_gateway(prompt_mode="token_exact")
    session_id, key = new_session(gw, prompt_mode="template")
    ids = three_turn_session(family, gw, key)
    third = completion_record(gw, session_id, ids[2])
    assert third["diagnostics"]["drift"]["cause"] == "reasoning_dropped"


def drift_of_second_turn(
    family: Family, gw: BackgroundGateway, session_id: str, key: str, answer: str, args: str
) -> dict[str, Any]:
    """The second turn's drift when the model wrote `answer` (a call) and the client
    sends the call back with `args` as its arguments."""
    client = openai_client(gw, key)
    gw.engine.script(answer, family.answer(text="Done."))
    first = ask(client, QUESTION, stream=False)
    call = first["message"]["tool_calls"][0]
    call["function"]["arguments"] = args
    messages = [
        *QUESTION,
        first["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": "22 C"},
    ]
    second = ask(client, messages, stream=False)
    rec = completion_record(gw, session_id, second["id"])
    assert rec["parent_id"] == first["id"]  # the same call, compared as parsed JSON
    assert rec["tokens_continue_parent"] is False
    return rec["diagnostics"]["drift"]


@QWEN3_ONLY
def test_drift_from_rewritten_tool_arguments(family, family_gateway, new_session):
    """The client sends the call's arguments back in another key order: the template
    writes them as sent, not as the model wrote them."""
    gw = family_gateway()
    session_id, key = new_session(gw)
    answer = _hermes_call({"city": "Paris", "unit": "C"})
    found = drift_of_second_turn(
        family, gw, session_id, key, answer, '{"unit": "C", "city": "Paris"}'
    )
    assert found["cause"] == "tool_arguments"
    assert metric(gw, "turnstile_prompt_drift_tool_arguments_total") == 1
    assert read_session(gw, session_id)["stats"]["drift_causes"] == {"tool_arguments": 1}


@QWEN3_ONLY
def test_drift_from_whitespace(family, family_gateway, new_session):
    """The model wrote compact JSON; the template writes it back with spaces."""
    gw = family_gateway()
    session_id, key = new_session(gw)
    answer = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
    found = drift_of_second_turn(family, gw, session_id, key, answer, '{"city": "Paris"}')
    assert found["cause"] == "whitespace"
    assert metric(gw, "turnstile_prompt_drift_whitespace_total") == 1


def _hermes_call(args: dict[str, Any]) -> str:
    return (
        "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": args}) + "\n</tool_call>"
    )


def test_token_exact_with_harmony():
    """gpt-oss: the text after a call is the tool result's message; after a final
    answer, the next user message (the model's `<|return|>` stays)."""
    from gateway.chat.template import ChatRenderer

    tok = family_tokenizer("gptoss")
    renderer = ChatRenderer(tok)
    family = FAMILIES["gptoss"]
    first = renderer.render(QUESTION, TOOLS)
    out1 = scripted_ids(family, family.answer([("get_weather", {"city": "Paris"})], "", "Ask."))
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    answer = {"role": "assistant", "content": "", "reasoning_content": "Ask.", "tool_calls": [call]}
    messages = [*QUESTION, answer, {"role": "tool", "tool_call_id": "c1", "content": "22 C"}]
    second = renderer.render_token_exact(messages, 3, (first.ids, out1), TOOLS)
    assert second.prompt_mode == "token_exact"
    assert second.text == (
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>22 C"
        "<|end|><|start|>assistant"
    )
    assert second.ids[: len(first.ids) + len(out1)] == first.ids + out1


def test_str_format_stays_sandboxed_however_often_it_is_read(tokenizer) -> None:
    """The renderer reads attributes the sandbox judged safe directly, except
    `format`/`format_map`, whose sandboxed wrapper keeps `{0.__class__}` out."""
    from gateway.chat.template import ChatRenderer

    renderer = ChatRenderer(
        tokenizer,
        chat_template="{% for m in messages %}{{ '{0.__class__}'.format(m.content) }}"
        "{{ '{0}!'.format(m.role) }}{% endfor %}",
    )
    for _ in range(3):
        assert renderer.render_text([{"role": "user", "content": "hi"}]) == "user!"


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.append(1) }}",
        "{% for m in messages %}{{ m.update({'role': 'x'}) }}{% endfor %}",
    ],
)
def test_the_template_sandbox_refuses_what_changes_the_messages(tokenizer, template) -> None:
    """The renderer keeps the sandbox's verdict per (type, attribute) for speed: the
    second render must be refused as the first was, and safe attributes still work."""
    from jinja2.exceptions import SecurityError

    from gateway.chat.template import ChatRenderer

    renderer = ChatRenderer(tokenizer, chat_template=template)
    for _ in range(2):
        with pytest.raises(SecurityError):
            renderer.render_text([{"role": "user", "content": "hi"}])
    safe = ChatRenderer(
        tokenizer,
        chat_template="{% for m in messages %}{{ m.content.upper() }}{{ loop.first }}"
        "{{ m.role }}{% endfor %}",
    )
    assert [safe.render_text([{"role": "user", "content": "hi"}]) for _ in range(2)] == [
        "HITrueuser"
    ] * 2
