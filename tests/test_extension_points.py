"""Each extension point takes a new piece from outside the package, in one place.

docs/architecture.md ("How to add ...") names the one file to touch for an endpoint,
an inference engine, an export style and a tool parser; these tests do exactly that
from here and check the new piece serves, records and exports like the built-in ones.
(A new loss: tests/test_trainer_modes.py.)
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
from fastapi import APIRouter
from gateway_helpers import admin_headers, bearer, read_session

import gateway.app
from gateway.chat.events import ToolCall, ToolCallEvent, content_events
from gateway.chat.parsers import TOOL_PARSERS, ToolParser
from gateway.config import GatewayConfig
from gateway.entrypoints.openai.protocol import OpenAIRequest
from gateway.entrypoints.openai.route import openai_route
from gateway.inference.fake import FakeEngine
from gateway.inference.registry import INFERENCE_ENGINES, register_inference_engine
from gateway.samples import EXPORT_STYLES, Sample, register_export_style
from gateway.server import BackgroundGateway
from gateway.serving.endpoint import Choice, Prepared, ServingEndpoint
from gateway.serving.generate import Sampling
from gateway.serving.prompt import Prompt
from gateway.serving.turn import Answer, ChoiceOutput, Turn, choice_ids


# ---- an endpoint: one serving class + one router, added to gateway.app.ROUTERS -----------
class ShoutRequest(OpenAIRequest):
    text: str


class ShoutServing(ServingEndpoint[ShoutRequest]):
    """Answers the engine's completion of `text`, in capitals."""

    endpoint = "shout"

    def num_choices(self, req: ShoutRequest) -> int:
        return 1

    async def prepare(self, req: ShoutRequest, session: Any) -> Prepared:
        ids = self.prompts.renderer.tokenizer.encode(req.text, add_special_tokens=False)
        turn = self.turn(req, session, Prompt(ids, "text"), choice_ids("shout", 1), Sampling(16))
        return Prepared(req, [turn], stream=req.stream)

    def new_choice(self, p: Prepared, turn: Turn, index: int) -> Choice:
        return Choice(index, None, p.stream)

    def finish(self, p: Prepared, turn: Turn, choice: Choice, out: ChoiceOutput) -> Answer:
        return Answer(out, out.finish_reason, {"text": out.text.upper()}, out.completion_id)

    def response(self, p: Prepared, answers: list[Answer]) -> dict[str, Any]:
        return {"id": answers[0].out.completion_id, **answers[0].response}

    def replay_body(self, req: ShoutRequest, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": rows[0]["id"], **rows[0]["response"]}

    def replay_frames(self, req: ShoutRequest, rows: list[dict[str, Any]]) -> list[bytes]:
        return []  # (its choices stream no frames)


def _shout_route(router: APIRouter) -> types.ModuleType:
    module = types.ModuleType("shout_endpoint")
    module.router = router  # type: ignore[attr-defined]
    return module


def test_a_new_endpoint_is_one_serving_class_and_one_route(
    gateway_factory, monkeypatch, new_session, http
) -> None:
    router = openai_route("/shout", ShoutRequest, ShoutServing)
    monkeypatch.setattr(gateway.app, "ROUTERS", (*gateway.app.ROUTERS, _shout_route(router)))
    gw = gateway_factory()
    sid, key = new_session(gw)
    r = http.post(f"{gw.url}/shout", json={"text": "hi"}, headers=bearer(key))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"].isupper() and body["text"]
    [record] = read_session(gw, sid)["completions"]
    assert record["id"] == body["id"] and record["endpoint"] == "shout"
    assert record["output_ids"] and len(record["output_logprobs"]) == len(record["output_ids"])
    # the template's retry handling comes for free: same body, retry count 1 -> same answer
    again = http.post(
        f"{gw.url}/shout",
        json={"text": "hi"},
        headers={**bearer(key), "x-stainless-retry-count": "1"},
    )
    assert again.json() == body
    assert len(read_session(gw, sid)["completions"]) == 1


# ---- an inference engine: one builder registered by name ----------------------------------
def test_a_new_engine_is_one_registered_builder(tmp_path, tokenizer, monkeypatch, http) -> None:
    reply = tokenizer.encode("Registered engine here.", add_special_tokens=False)
    built: list[GatewayConfig] = []

    @register_inference_engine("test-echo", weights="disk", trainable=False, help="test")
    def _build(config: GatewayConfig) -> FakeEngine:
        built.append(config)
        return FakeEngine(reply, int(tokenizer.eos_token_id))

    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
    try:
        config = GatewayConfig(database=str(tmp_path / "e.db"), admin_key="adm", engine="test-echo")
        with BackgroundGateway(config) as gw:
            r = http.post(f"{gw.url}/sessions", json={}, headers={"authorization": "Bearer adm"})
            key = r.json()["api_key"]
            r = http.post(
                f"{gw.url}/chat/completions",
                json={"messages": [{"role": "user", "content": "hello"}]},
                headers=bearer(key),
            )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "Registered engine here."
        assert built and built[0].engine == "test-echo"
        import argparse

        from gateway.cli import add_serve_args

        parser = argparse.ArgumentParser()
        add_serve_args(parser)
        assert parser.parse_args(["--engine", "test-echo"]).engine == "test-echo"
    finally:
        INFERENCE_ENGINES.pop("test-echo", None)


# ---- an export style: one decorated function ---------------------------------------------
def test_a_new_export_style_is_one_decorated_function(fake_gateway, new_session, http) -> None:
    @register_export_style("last-turn")
    def last_turn(session_id: str, completions: list[dict[str, Any]], gamma: float) -> list:
        c = max(completions, key=lambda c: c["created_at"])
        n = len(c["prompt_ids"])
        return [
            Sample(
                session_id, [c["id"]], c["prompt_ids"] + c["output_ids"],
                [0] * n + [1] * len(c["output_ids"]), [0.0] * n + c["output_logprobs"],
                [-1] * n + c["output_versions"], c["reward"] or 0.0, c["reward"] or 0.0,
            )
        ]  # fmt: skip

    try:
        sid, key = new_session(fake_gateway)
        messages = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            r = http.post(
                f"{fake_gateway.url}/chat/completions",
                json={"messages": messages},
                headers=bearer(key),
            )
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        cid = r.json()["id"]
        http.post(
            f"{fake_gateway.url}/rewards",
            json={"completion_id": cid, "reward": 1.0},
            headers=bearer(key),
        )
        r = http.get(
            f"{fake_gateway.url}/sessions/{sid}/export",
            params={"style": "last-turn"},
            headers=admin_headers(),
        )
        assert r.status_code == 200, r.text
        [sample] = r.json()["samples"]
        assert sample["completion_ids"] == [cid] and sample["returns"] == 1.0
    finally:
        EXPORT_STYLES.pop("last-turn", None)


# ---- a tool parser: one registered class, chosen by config (or detected from a template) --
class BracketParser(ToolParser):
    """Calls written as `[[name {"json": "args"}]]`, whole answers at a time."""

    def __init__(self) -> None:
        super().__init__()
        self._text = ""

    def feed(self, text: str) -> list:
        self._text += text
        return []

    def finish(self) -> list:
        events: list = []
        rest = self._text
        while "[[" in rest and "]]" in rest:
            before, _, tail = rest.partition("[[")
            inner, _, rest = tail.partition("]]")
            name, _, args = inner.partition(" ")
            events += content_events(before.strip())
            self.content_parts.append(before.strip())
            call = ToolCall(f"call_{len(self.tool_calls)}", name, json.dumps(json.loads(args)))
            events.append(ToolCallEvent(len(self.tool_calls), call))
            self.tool_calls.append(call)
        events += content_events(rest)
        self.content_parts.append(rest)
        return events


def test_a_new_tool_parser_is_one_registered_class(gateway_factory, new_session, http) -> None:
    TOOL_PARSERS.register("brackets")(BracketParser)
    try:
        gw = gateway_factory({"tool_parser": "brackets"})
        gw.engine.script('Let me look. [[get_weather {"city": "Paris"}]]')
        _, key = new_session(gw)
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        r = http.post(
            f"{gw.url}/chat/completions",
            json={"messages": [{"role": "user", "content": "Weather?"}], "tools": tools},
            headers=bearer(key),
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    finally:
        TOOL_PARSERS.pop("brackets", None)


def test_an_unknown_tool_parser_fails_at_start_up(gateway_factory) -> None:
    with pytest.raises(Exception, match="unknown tool parser 'nope'"):
        gateway_factory({"tool_parser": "nope"})
