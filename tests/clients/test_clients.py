"""Real client libraries against the real gateway, each from its own virtualenv.

For each client a script in scripts/ runs INSIDE that client's venv (.venv-clients/<name>,
made by `make clients-setup`): it holds a tool-calling conversation with a gateway backed
by a scripted fake engine (first a `get_weather` call, then, once the prompt holds the
tool's answer, text). This test, in the main venv, then checks what the gateway recorded
for both turns and rewards the last one over REST.

A missing or stale client venv FAILS the test (it never skips): run `make clients-setup`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import bearer, http_client, read_session

pytestmark = pytest.mark.clients

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCRIPTS = HERE / "scripts"
REQUIREMENTS = HERE / "requirements"
VENVS = Path(os.environ.get("TURNSTILE_CLIENT_VENVS", REPO / ".venv-clients"))
SETUP_HINT = "run `make clients-setup` (or `bash tests/clients/setup_venvs.sh`)"
RESULT_PREFIX = "CLIENT-RESULT "  # as in scripts/_common.py
SCRIPT_TIMEOUT_S = 180

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL_TEXT = "It is sunny in Paris."
TOOL_RESULT = "Sunny, 22 C in Paris."  # what the scripts' get_weather returns
# Every proxy points at a closed port: a client that tries to reach the internet fails
# instead of quietly phoning home. The gateway, on loopback, is exempt.
DEAD_PROXY = "http://127.0.0.1:9"


@dataclass(frozen=True)
class Case:
    client: str
    mode: str
    streams: bool
    # Positions in the script's `completion_ids` that the library exposes (it does not
    # always: langchain's and openai-agents' streams, camel's first turn).
    visible_ids: tuple[int, ...] = (0, 1)
    responses_api: bool = False

    @property
    def id(self) -> str:
        return f"{self.client}-{self.mode}"


CASES = [
    Case("openai", "sync", streams=False),
    Case("openai", "async", streams=False),
    Case("openai", "stream", streams=True),
    Case("langchain", "invoke", streams=False),
    Case("langchain", "stream", streams=True, visible_ids=()),
    Case("camel", "step", streams=False, visible_ids=(1,)),
    Case("agents", "chat", streams=False),
    Case("agents", "chat-stream", streams=True, visible_ids=()),
    Case("agents", "responses", streams=False, responses_api=True),
    Case("agents", "responses-stream", streams=True, responses_api=True),
    Case("litellm", "sync", streams=False),
    Case("litellm", "stream", streams=True),
]


def params() -> list[Any]:
    return [pytest.param(c, id=c.id) for c in CASES]


def client_python(name: str) -> Path:
    """The client venv's interpreter; fail (never skip) when it is missing or stale."""
    python = VENVS / name / "bin" / "python"
    req = REQUIREMENTS / f"{name}.txt"
    stamp = VENVS / name / f".installed-{hashlib.sha1(req.read_bytes()).hexdigest()[:12]}"
    if not python.exists():
        pytest.fail(f"client venv {VENVS / name} is missing: {SETUP_HINT}", pytrace=False)
    if not stamp.exists():
        pytest.fail(
            f"client venv {VENVS / name} does not match {req.relative_to(REPO)}: {SETUP_HINT}",
            pytrace=False,
        )
    return python


def weather_reply(tokenizer):
    """The fake engine's script: a tool call, or the final text once a tool has answered."""

    def reply(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        return FINAL_TEXT if "<|im_start|>tool\n" in prompt else TOOL_CALL

    return reply


def client_env(base_url: str, api_key: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().endswith("_PROXY") and not k.startswith(("OPENAI_", "PYTHON"))
    }
    env.update(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY=api_key,
        HTTP_PROXY=DEAD_PROXY,
        HTTPS_PROXY=DEAD_PROXY,
        http_proxy=DEAD_PROXY,
        https_proxy=DEAD_PROXY,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        HF_HUB_OFFLINE="1",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_client(case: Case, base_url: str, api_key: str) -> dict[str, Any]:
    python = client_python(case.client)
    cmd = [
        str(python),
        str(SCRIPTS / f"{case.client}_agent.py"),
        "--base-url",
        base_url,
        "--api-key",
        api_key,
        "--mode",
        case.mode,
    ]
    proc = subprocess.run(
        cmd,
        env=client_env(base_url, api_key),
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        cwd=SCRIPTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or len(lines) != 1:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        pytest.fail(
            f"{case.id} exited with {proc.returncode}; the end of its stderr:\n"
            + proc.stderr[-3000:],
            pytrace=False,
        )
    return json.loads(lines[0][len(RESULT_PREFIX) :])


def arguments(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def check_tokens(record: dict[str, Any]) -> None:
    """The exact tokens: prompt and output ids, one logprob and one version per token."""
    prompt, output = record["prompt_ids"], record["output_ids"]
    assert prompt and all(isinstance(t, int) for t in prompt)
    assert output and all(isinstance(t, int) for t in output)
    assert len(record["output_logprobs"]) == len(output)
    assert all(isinstance(x, float) and x <= 0.0 for x in record["output_logprobs"])
    assert len(record["output_versions"]) == len(output)
    assert record["prompt_tokens"] == len(prompt)


def recorded_tool_calls(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(call id, name, JSON arguments) of the calls a recorded answer made."""
    response = record["response"]
    if "message" in response:  # Chat Completions
        return [
            (tc["id"], tc["function"]["name"], tc["function"]["arguments"])
            for tc in response["message"].get("tool_calls") or []
        ]
    return [  # Responses API: function_call output items
        (item["call_id"], item["name"], item["arguments"])
        for item in response.get("output") or []
        if item.get("type") == "function_call"
    ]


def recorded_tool_outputs(record: dict[str, Any]) -> list[str]:
    """The call ids of the tool results a recorded request sent back."""
    request = record["request"]
    if "messages" in request:  # Chat Completions: tool messages
        return [m["tool_call_id"] for m in request["messages"] if m.get("role") == "tool"]
    items = request.get("input")  # Responses API: function_call_output items
    return [
        item["call_id"]
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def check_client_specifics(case: Case, seen: dict[str, Any]) -> None:
    """What only some clients show: stream deltas, usage chunks, the SDK's own events."""
    if case.client == "openai" and case.streams:
        # The first delta of a call names it; the argument pieces follow.
        [delta] = seen["first_tool_call_deltas"]
        assert delta["id"] == seen["tool_calls"][0]["id"]
        assert delta["type"] == "function" and delta["function"]["name"] == "get_weather"
        assert delta["function"]["arguments"] == ""
        # stream_options.include_usage: a final usage chunk for each completion.
        assert all(u and u["completion_tokens"] > 0 for u in seen["usage"]), seen["usage"]
    if case.client == "openai":
        assert seen["finish_reasons"] == ["tool_calls", "stop"]
    if case.client in ("langchain", "litellm"):
        assert seen["finish_reasons"] == ["tool_calls", "stop"]
    if case.client == "agents":
        assert seen["num_model_calls"] == 2
        assert [o["call_id"] for o in seen["tool_call_outputs"]] == [seen["tool_calls"][0]["id"]]
        if case.streams:
            events = set(seen["stream_event_types"])
            expected = {
                "response.created",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.output_item.done",
                "response.output_text.delta",
                "response.completed",
            }
            assert expected <= events, sorted(events)


@pytest.mark.parametrize("case", params())
def test_client_tool_conversation_is_recorded_and_rewardable(
    case: Case, gateway_factory, new_session, tokenizer
):
    python = client_python(case.client)  # fail fast, before starting a gateway
    assert python.exists()
    gateway = gateway_factory(reply_ids=weather_reply(tokenizer))
    session_id, api_key = new_session(gateway, metadata={"client": case.id})

    seen = run_client(case, gateway.url, api_key)

    # What the client saw: one get_weather call with an OpenAI-style id, then the text.
    assert seen["client"] == case.client and seen["mode"] == case.mode
    [call] = seen["tool_calls"]
    assert call["name"] == "get_weather"
    assert call["id"].startswith("call_"), call
    assert arguments(call["arguments"]) == {"city": "Paris"}
    assert seen["tool_results"] == [{"city": "Paris", "result": TOOL_RESULT}]
    assert seen["final_text"] == FINAL_TEXT
    check_client_specifics(case, seen)

    # What the gateway recorded: exactly the two turns, the second a child of the first.
    session = read_session(gateway, session_id)
    completions = sorted(session["completions"], key=lambda c: c["created_at"])
    assert len(completions) == 2, [c["id"] for c in completions]
    first, second = completions
    for record in completions:
        check_tokens(record)
        assert bool(record["request"].get("stream")) is case.streams
    assert second["parent_id"] == first["id"]
    assert first["parent_id"] is None
    # Clients re-serialise tool calls: whether the tokens continue is reported, not required.
    assert second["tokens_continue_parent"] in (True, False)

    [(call_id, name, args)] = recorded_tool_calls(first)
    assert (call_id, name, json.loads(args)) == (call["id"], "get_weather", {"city": "Paris"})
    assert "<tool_call>" in tokenizer.decode(first["output_ids"])
    assert recorded_tool_outputs(second) == [call["id"]]
    assert TOOL_RESULT in tokenizer.decode(second["prompt_ids"])
    if not case.responses_api:
        assert first["finish_reason"] == "tool_calls"
        assert second["finish_reason"] == "stop"
        assert second["response"]["message"]["content"] == FINAL_TEXT
    assert tokenizer.decode(second["output_ids"]).startswith(FINAL_TEXT)

    # The ids the library showed are the recorded ones, in order.
    recorded_ids = [first["id"], second["id"]]
    for i in case.visible_ids:
        assert seen["completion_ids"][i] == recorded_ids[i], (i, seen["completion_ids"])

    # Reward the last turn with the session's own key, and read it back.
    with http_client() as http:
        r = http.post(
            f"{gateway.url}/rewards",
            headers=bearer(api_key),
            json={"completion_id": second["id"], "reward": 1.0},
        )
    assert r.status_code == 200, r.text
    assert r.json()["data"] == [{"completion_id": second["id"], "reward": 1.0}]
    rewards = {c["id"]: c["reward"] for c in read_session(gateway, session_id)["completions"]}
    assert rewards == {first["id"]: None, second["id"]: 1.0}


# tested in test_anthropic_clients.py (the Messages API: anthropic SDK, Claude Code)
ANTHROPIC_CLIENTS = {"anthropic", "claude_code"}


def test_every_client_venv_has_a_requirements_file_and_a_script():
    """Each requirements file is used by a case, and each case has its script."""
    clients = {c.client for c in CASES} | ANTHROPIC_CLIENTS
    # trackers.txt: the trainer's experiment trackers (test_experiment_trackers.py)
    assert {p.stem for p in REQUIREMENTS.glob("*.txt")} == clients | {"trackers"}
    for client in clients:
        assert (SCRIPTS / f"{client}_agent.py").is_file()
