"""Anthropic clients against the real gateway, each from its own virtualenv.

- The `anthropic` SDK (.venv-clients/anthropic): a tool round trip whole and streamed,
  count_tokens, thinking blocks sent back, and its retries of a 529.
- Claude Code, the CLI bundled in `claude-agent-sdk` (.venv-clients/claude_code), run
  inside `unshare -n` (a network namespace with only loopback; we are root) with
  nonessential traffic off, so nothing can leave the machine whatever it tries. It
  reaches the gateway through a Unix socket (scripts/_relay.py). First with an engine
  that emits scripted tokens (a Bash call, then text), then with the real SmolLM2.

Each checks what the gateway recorded, token-exact, and rewards by the `msg_` id.
A missing or stale client venv FAILS (never skips): run `make clients-setup`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import ADMIN_KEY, bearer, http_client, read_session
from test_clients import (
    FINAL_TEXT,
    SCRIPT_TIMEOUT_S,
    SCRIPTS,
    TOOL_CALL,
    TOOL_RESULT,
    check_tokens,
    client_env,
    client_python,
    weather_reply,
)

from gateway.config import GatewayConfig
from gateway.inference.base import EngineError
from gateway.server import BackgroundGateway

sys.path.insert(0, str(SCRIPTS.parents[2] / "agents"))
from claude_code_relay import unix_to_tcp  # noqa: E402

pytestmark = pytest.mark.clients
RESULT_PREFIX = "CLIENT-RESULT "
BASH_CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo hello > out.txt", '
    '"description": "Write the file"}}\n</tool_call>'
)
BASH_DONE = "I wrote hello to out.txt."
TASK = "Create a file out.txt containing hello, using Bash."


def run_script(
    python: Path,
    args: list[str],
    env: dict[str, str],
    prefix: list[str] = (),
    timeout_s: float = SCRIPT_TIMEOUT_S * 2,
):
    proc = subprocess.run(
        [*prefix, str(python), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=SCRIPTS,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or len(lines) != 1:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        pytest.fail(f"{args[0]} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(lines[0][len(RESULT_PREFIX) :])


def anthropic_sdk(gateway: BackgroundGateway, key: str, mode: str) -> dict[str, Any]:
    python = client_python("anthropic")
    base = gateway.url.removesuffix("/v1")
    args = ["anthropic_agent.py", "--base-url", base, "--api-key", key, "--mode", mode]
    env = {k: v for k, v in client_env(base, key).items() if not k.startswith("ANTHROPIC_")}
    return run_script(python, args, env)


def records(gateway: BackgroundGateway, session_id: str) -> list[dict[str, Any]]:
    return sorted(read_session(gateway, session_id)["completions"], key=lambda c: c["created_at"])


@pytest.mark.parametrize("mode", ["create", "stream"])
def test_anthropic_sdk_tool_round_trip(mode, gateway_factory, new_session, tokenizer):
    client_python("anthropic")
    gateway = gateway_factory(reply_ids=weather_reply(tokenizer))
    session_id, key = new_session(gateway)
    seen = anthropic_sdk(gateway, key, mode)

    [call] = seen["tool_uses"]
    assert call["name"] == "get_weather" and call["input"] == {"city": "Paris"}
    assert call["id"].startswith("toolu_")
    assert seen["tool_results"] == [{"city": "Paris", "result": TOOL_RESULT}]
    assert seen["stop_reasons"] == ["tool_use", "end_turn"]
    assert seen["final_text"] == FINAL_TEXT
    if mode == "stream":
        kinds = set(seen["event_types"])
        assert {"message_start", "content_block_start", "content_block_stop"} <= kinds
        assert {"message_delta", "message_stop", "text", "input_json"} <= kinds, kinds

    first, second = records(gateway, session_id)
    assert [first["id"], second["id"]] == seen["message_ids"]
    for record, usage in zip((first, second), seen["usage"], strict=True):
        check_tokens(record)
        assert usage["input_tokens"] == len(record["prompt_ids"])
        assert usage["output_tokens"] == len(record["output_ids"])
    assert tokenizer.decode(first["output_ids"], skip_special_tokens=True) == TOOL_CALL
    assert second["parent_id"] == first["id"] and second["tokens_continue_parent"]
    assert TOOL_RESULT in tokenizer.decode(second["prompt_ids"])
    # count_tokens of the conversation so far (up to the tool result): the second
    # turn's prompt, token for token
    assert seen["count_tokens"] == len(second["prompt_ids"])

    with http_client() as http:
        r = http.post(
            f"{gateway.url}/rewards",
            headers=bearer(key),
            json={"completion_id": second["id"], "reward": 1.0},
        )
    assert r.status_code == 200, r.text
    assert {c["id"]: c["reward"] for c in records(gateway, session_id)}[second["id"]] == 1.0


def test_anthropic_sdk_thinking(gateway_factory, new_session):
    client_python("anthropic")
    gateway = gateway_factory({"reasoning_parser": "qwen3"})
    gateway.engine.script("<think>2 and 2 make 4.</think>4", "<think>Checked.</think>Yes, 4.")
    # token_exact: SmolLM2's template would not show the earlier thinking again
    session_id, key = new_session(gateway, prompt_mode="token_exact")
    seen = anthropic_sdk(gateway, key, "thinking")
    first_blocks, second_blocks = seen["blocks"]
    assert [b["type"] for b in first_blocks] == ["thinking", "text"]
    assert first_blocks[0]["thinking"] == "2 and 2 make 4."
    assert first_blocks[0]["signature"].startswith("tsig_")
    assert [b.get("text") for b in second_blocks][1] == "Yes, 4."
    first, second = records(gateway, session_id)
    assert second["parent_id"] == first["id"] and second["tokens_continue_parent"]


def test_anthropic_sdk_retries_a_529(gateway_factory, new_session, tokenizer):
    client_python("anthropic")
    failures = [EngineError("warming up"), EngineError("warming up")]

    def reply(_prompt_ids: list[int]) -> str:
        if failures:
            raise failures.pop()
        return "Hello!"

    gateway = gateway_factory(reply_ids=reply)
    session_id, key = new_session(gateway)
    seen = anthropic_sdk(gateway, key, "retry")
    assert seen["retries_taken"] == 2
    [record] = records(gateway, session_id)
    assert record["id"] == seen["message_ids"][0]


# ---- Claude Code ---------------------------------------------------------------------
def claude_code(
    gateway: BackgroundGateway,
    key: str,
    workdir: Path,
    prompt: str,
    extra_env: dict[str, str],
    max_turns: int = 4,
    timeout_s: float = SCRIPT_TIMEOUT_S * 2,
    answers: int = 0,
) -> dict[str, Any]:
    """Run the task with Claude Code inside `unshare -n`, relayed to the gateway."""
    python = client_python("claude_code")
    if os.geteuid() != 0:
        pytest.fail("Claude Code runs inside `unshare -n`, which needs root", pytrace=False)
    socket = str(workdir.parent / "gateway.sock")
    relay = gateway.call(unix_to_tcp(socket, gateway.config.port))  # on the gateway's loop
    env = {k: v for k, v in client_env("", key).items() if not k.startswith("ANTHROPIC_")}
    env.update(extra_env)
    args = ["claude_code_agent.py", "--socket", socket, "--api-key", key]
    args += ["--workdir", str(workdir), "--prompt", prompt, "--max-turns", str(max_turns)]
    args += ["--answers", str(answers)]
    try:
        return run_script(python, args, env, prefix=["unshare", "-n"], timeout_s=timeout_s)
    finally:
        gateway.loop.call_soon_threadsafe(relay.close)


def test_claude_code_bash_round_trip_is_recorded(gateway_factory, new_session, tokenizer, tmp_path):
    """Scripted tokens: a Bash call (which really runs), then the final answer."""
    client_python("claude_code")

    def reply(prompt_ids: list[int]) -> str:
        return BASH_DONE if "<|im_start|>tool\n" in tokenizer.decode(prompt_ids) else BASH_CALL

    gateway = gateway_factory(reply_ids=reply)
    session_id, key = new_session(gateway, metadata={"client": "claude-code"})
    workdir = tmp_path / "work"
    seen = claude_code(gateway, key, workdir, TASK, {})

    [call] = seen["tool_uses"]
    assert call["name"] == "Bash" and call["input"]["command"] == "echo hello > out.txt"
    [result] = seen["tool_results"]
    assert result["tool_use_id"] == call["id"] and not result["is_error"]
    assert seen["result"]["subtype"] == "success" and seen["result"]["result"] == BASH_DONE
    assert (workdir / "out.txt").read_text() == "hello\n"  # the Bash call really ran

    main = [r for r in records(gateway, session_id) if not r["side_request"]]
    first, second = main
    for record in main:
        check_tokens(record)
        assert record["endpoint"] == "messages" and record["request"]["stream"] is True
    assert first["id"] == call["id"].replace("toolu_", "msg_").rsplit("_", 1)[0]
    assert tokenizer.decode(first["output_ids"], skip_special_tokens=True) == BASH_CALL
    assert second["parent_id"] == first["id"] and second["tokens_continue_parent"]
    n = len(first["prompt_ids"]) + len(first["output_ids"])
    assert second["prompt_ids"][:n] == first["prompt_ids"] + first["output_ids"]
    assert result["content"] in tokenizer.decode(second["prompt_ids"][n:])
    assert tokenizer.decode(second["output_ids"], skip_special_tokens=True) == BASH_DONE

    with http_client() as http:
        r = http.post(
            f"{gateway.url}/rewards",
            headers=bearer(key),
            json={"completion_id": second["id"], "reward": 1.0},
        )
        assert r.status_code == 200, r.text
        export = http.get(
            f"{gateway.url}/sessions/{session_id}/export",
            headers=bearer(ADMIN_KEY),
            params={"style": "concat"},
        ).json()
    [sample] = export["samples"]
    assert sample["completion_ids"] == [first["id"], second["id"]]
    assert sample["reward"] == 1.0


@pytest.mark.slow
def test_claude_code_with_smollm2(new_session, tmp_path):
    """The real SmolLM2 answers Claude Code's first turn (its prompt with only the Bash
    tool, ~3,900 tokens, fits the 8k context). One answer, its output capped by Claude
    Code's own setting; the run stops once Claude Code has shown it (a cut answer would
    otherwise get Claude Code's continuation requests, each another ~4k-token prefill,
    slow on a shared 2-core CPU)."""
    client_python("claude_code")
    config = GatewayConfig(
        port=0, database=str(tmp_path / "e.db"), admin_key=ADMIN_KEY, engine="embedded"
    )
    with BackgroundGateway(config) as gateway:
        session_id, key = new_session(gateway, sampling={"temperature": 0.0})
        env = {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16", "MAX_THINKING_TOKENS": "0"}
        # a ~4k-token prefill on a CPU: minutes when the machine is shared
        seen = claude_code(
            gateway, key, tmp_path / "work", "Say hello.", env, timeout_s=1200, answers=1
        )
        answered = [r for r in records(gateway, session_id) if r["finish_reason"] != "abort"]
        [record] = [r for r in answered if not r["side_request"]]
    check_tokens(record)
    assert record["endpoint"] == "messages" and record["request"]["stream"] is True
    assert record["prompt_tokens"] > 1000  # Claude Code's system prompt and Bash tool
    assert 0 < record["completion_tokens"] <= 16
    assert record["request"]["max_tokens"] == 16
    blocks = record["response"]["message"]["content"]
    text = "".join(b.get("text", "") for b in blocks)
    assert text and seen["texts"] == [text]  # what Claude Code showed is what was recorded
    assert record["response"]["message"]["stop_reason"] in ("end_turn", "max_tokens")


def test_claude_code_training_workflow_rewards_the_created_file(
    gateway_factory, new_session, tokenizer
):
    """agents/claude_code.py as the trainer runs it: one episode, its own session key;
    the reward checks the file Claude Code had to create."""
    from trainer.api import import_file

    agents = import_file(SCRIPTS.parents[2] / "agents" / "claude_code.py")
    [task] = agents.file_tasks(1, seed=3)
    call = json.dumps({"name": "Bash", "arguments": {"command": f"echo {task['content']} > "
                                                     f"{task['file']}"}})  # fmt: skip
    script = {True: "Done.", False: f"<tool_call>\n{call}\n</tool_call>"}

    def reply(prompt_ids: list[int]) -> str:
        return script["<|im_start|>tool\n" in tokenizer.decode(prompt_ids)]

    gateway = gateway_factory(reply_ids=reply)
    session_id, key = new_session(gateway)
    agent = agents.ClaudeCodeAgent(python=str(client_python("claude_code")), max_turns=3)
    reward = asyncio.run(agent.run(task, base_url=gateway.url, api_key=key))
    assert reward == 1.0
    main = [r for r in records(gateway, session_id) if not r["side_request"]]
    assert len(main) == 2 and main[1]["parent_id"] == main[0]["id"]
