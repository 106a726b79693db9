"""A client retry (`x-stainless-retry-count`, same body) is answered from the original's
records, on every generating endpoint: the same answer, streamed again when it was
streamed, and no second sample."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic_helpers import sse_events
from gateway_helpers import WEATHER, bearer, http_client, read_session

# reasoning, text and a tool call: every kind of part an answer holds
REPLY = (
    "<think>Look it up.</think>Checking."
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city.",
    "input_schema": WEATHER["function"]["parameters"],
}
BODIES = {
    "chat/completions": {"messages": QUESTION, "tools": [WEATHER], "logprobs": True, "n": 2},
    # (top logprobs are not recorded: a retry has none to send)
    "completions": {"prompt": ["Say hi.", "Say bye."], "n": 2, "logprobs": 0},
    "messages": {"max_tokens": 64, "messages": QUESTION, "tools": [ANTHROPIC_TOOL]},
    "responses": {
        "input": "Weather in Paris?",
        "tools": [{"type": "function", **WEATHER["function"]}],
    },
}


def answer_of(path: str, text: str) -> Any:
    """What a client makes of a streamed answer: the parts it assembles, in order."""
    if path == "messages":
        blocks: dict[int, dict[str, Any]] = {}
        ends = []
        for name, data in sse_events(text):
            if name == "content_block_start":
                blocks[data["index"]] = dict(data["content_block"])
            elif name == "content_block_delta":
                block = blocks[data["index"]]
                for field, value in data["delta"].items():
                    if field != "type":
                        block[field] = block.get(field, "") + value
            elif name == "message_start":
                ends.append(data["message"]["id"])
            elif name == "message_delta":
                ends.append(data)
        return ends, blocks
    if path == "responses":
        events = sse_events(text)
        names = [name for name, _ in events]
        done = [d["item"] for n, d in events if n == "response.output_item.done"]
        final = events[-1][1]["response"]
        assert [i["id"] for i in done] == [i["id"] for i in final["output"]]
        return names, done, final  # (the retry's items keep the original's ids)
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames.pop() == "[DONE]"
    parts: dict[int, dict[str, Any]] = {}
    for chunk in map(json.loads, frames):
        for c in chunk["choices"]:
            part = parts.setdefault(c["index"], {"id": chunk["id"]})
            delta = c.get("delta") or {"text": c.get("text")}
            for key in ("content", "reasoning_content", "text"):
                if delta.get(key):
                    part[key] = part.get(key, "") + delta[key]
            for call in delta.get("tool_calls") or []:
                part.setdefault("tool_calls", []).append(call)
            lp = c.get("logprobs") or {}  # chat's per-token entries; completions' two lists
            tokens = lp.get("content") or list(
                zip(lp.get("tokens", []), lp.get("token_logprobs", []), strict=True)
            )
            part.setdefault("logprobs", []).extend(tokens)
            if c["finish_reason"]:
                part["finish_reason"] = c["finish_reason"]
    return parts


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(BODIES))
def test_a_retry_gets_the_original_answer(gateway_factory, new_session, path, stream):
    gw = gateway_factory({"reasoning_parser": "qwen3"})
    session_id, key = new_session(gw)
    gw.engine.script(*[REPLY] * 4)
    body = {"model": "default", **BODIES[path], "stream": stream}
    url = f"{gw.url}/{path}"
    with http_client() as http:
        first = http.post(url, headers=bearer(key), json=body)
        retry = http.post(url, headers={**bearer(key), "x-stainless-retry-count": "1"}, json=body)
    assert first.status_code == retry.status_code == 200
    records = read_session(gw, session_id)["completions"]
    assert (
        len(records)
        == len(gw.engine.calls)
        == {"chat/completions": 2, "completions": 4}.get(path, 1)
    )  # one sample per choice, none for the retry
    if not stream:
        a, b = first.json(), retry.json()
        a.pop("created", None), b.pop("created", None)
        a.pop("created_at", None), b.pop("created_at", None)
        assert a == b
        return
    assert retry.headers["content-type"].startswith("text/event-stream")
    assert answer_of(path, retry.text) == answer_of(path, first.text)


@pytest.mark.parametrize("stream", [False, True])
def test_a_retry_of_an_echoed_completion_echoes_its_prompts(gateway_factory, new_session, stream):
    """`echo` puts each prompt before its answers; the retry's replay does too."""
    gw = gateway_factory()
    _, key = new_session(gw)
    gw.engine.script(*["Hi!"] * 4)
    body = {"model": "default", "prompt": ["Say hi.", "Say bye."], "n": 2, "echo": True}
    body["stream"] = stream
    url = f"{gw.url}/completions"
    with http_client() as http:
        first = http.post(url, headers=bearer(key), json=body)
        retry = http.post(url, headers={**bearer(key), "x-stainless-retry-count": "1"}, json=body)
    assert first.status_code == retry.status_code == 200
    assert len(gw.engine.calls) == 4  # the retry generated nothing
    if stream:
        texts = {i: p["text"] for i, p in answer_of("completions", retry.text).items()}
        assert texts == {i: p["text"] for i, p in answer_of("completions", first.text).items()}
    else:
        texts = {c["index"]: c["text"] for c in retry.json()["choices"]}
        assert texts == {c["index"]: c["text"] for c in first.json()["choices"]}
    assert texts == {0: "Say hi.Hi!", 1: "Say hi.Hi!", 2: "Say bye.Hi!", 3: "Say bye.Hi!"}


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_a_streamed_retry_sends_the_usage_it_was_asked_for(gateway_factory, new_session, path):
    """`stream_options.include_usage`: the retry's stream ends with the original's usage
    chunk (the OpenAI SDK reads a stream's token counts from it)."""
    gw = gateway_factory({"reasoning_parser": "qwen3"})
    _, key = new_session(gw)
    gw.engine.script(*[REPLY] * 4)
    body = {"model": "default", **BODIES[path], "stream": True}
    body["stream_options"] = {"include_usage": True}
    url = f"{gw.url}/{path}"
    with http_client() as http:
        first = http.post(url, headers=bearer(key), json=body)
        retry = http.post(url, headers={**bearer(key), "x-stainless-retry-count": "1"}, json=body)

    def usage(text: str) -> Any:
        frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
        assert frames[-1] == "[DONE]"
        last = json.loads(frames[-2])
        assert last["choices"] == []
        return last["usage"]

    assert usage(first.text)["completion_tokens"] > 0
    assert usage(retry.text) == usage(first.text)
