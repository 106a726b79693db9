"""Weights without disk: trainer rank 0 broadcasts over gloo to a gateway's engine.

The gateway runs as its own process (`turnstile serve --engine embedded`, the real
SmolLM2); this process plays trainer rank 0 with trainer/backend/weight_push.py.
After a push the gateway's greedy answers and logprobs are those of the pushed
weights (a forward pass here); tied embeddings arrive once and stay tied; refusals
are clear. The push into a real vLLM server is tests/test_vllm_weight_push.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from gateway_helpers import ADMIN_KEY, admin_headers, assert_error_shape, bearer

from bench.replicas import Replicas
from gateway.inference.weight_broadcast import (
    GroupSpec,
    Manifest,
    device_id,
    group_backend,
    host_store,
    open_group,
    receive,
)
from trainer.backend.weight_push import WeightPush, WeightPushError, gateway_root, push_weights

QUESTION = [{"role": "user", "content": "Name three colours."}]


# ---- the group and the manifest, in one process -----------------------------------------
def test_tied_tensors_are_sent_once_and_arrive_tied() -> None:
    emb = torch.randn(10, 4)
    named = {
        "model.embed_tokens.weight": emb,
        "counts": torch.arange(6).reshape(2, 3),
        "lm_head.weight": emb,
    }
    manifest, send_list = Manifest.of(named)
    assert [n for n, _, _ in manifest.tensors] == ["model.embed_tokens.weight", "counts"]
    assert manifest.tied == {"lm_head.weight": "model.embed_tokens.weight"}
    assert manifest.nbytes == 10 * 4 * 4 + 6 * 8

    store = host_store(GroupSpec("127.0.0.1", 0, 3, group_id="t", timeout_s=30))
    spec = GroupSpec("127.0.0.1", store.port, 3, group_id="t", timeout_s=30)
    got: dict[int, dict[str, torch.Tensor]] = {}

    def receiver(rank: int) -> None:
        group = open_group(spec, rank)
        got[rank] = dict(receive(group, Manifest.from_json(manifest.to_json())))

    threads = [threading.Thread(target=receiver, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    group = open_group(spec, 0, store=store)
    for t in send_list:
        group.broadcast(t.contiguous(), 0).wait()
    for t in threads:
        t.join(30)
    for rank in (1, 2):
        assert set(got[rank]) == set(named)
        assert all(torch.equal(got[rank][k], v) for k, v in named.items())
        assert got[rank]["lm_head.weight"] is got[rank]["model.embed_tokens.weight"]


def test_a_bad_manifest_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        Manifest.from_json({"tensors": [["w", "float33", [2]]]})
    with pytest.raises(ValueError, match="backend"):
        GroupSpec.from_json({"host": "h", "port": 1, "world_size": 2, "backend": "mpi"})
    assert gateway_root("127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"


def test_nccl_only_when_every_rank_has_a_gpu_of_its_own() -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected", seen on an H200) and
    cannot reach CPU memory: those groups take gloo, which stages CUDA tensors."""
    a, b = "cuda:GPU-0a1b", "cuda:GPU-9f8e"
    assert group_backend([a, b]) == "nccl"  # a trainer GPU, an engine on another
    assert group_backend([a, b, "cuda:GPU-77"]) == "nccl"
    assert group_backend([a, a]) == "gloo"  # trainer and engine share the card
    assert group_backend([a, b, b]) == "gloo"  # two engine workers on one card
    assert group_backend([a, "cpu"]) == "gloo"  # a GPU trainer, a CPU engine
    assert group_backend(["cpu", "cpu", "cpu"]) == "gloo"
    assert device_id("cpu") == device_id(torch.device("cpu")) == "cpu"


# ---- the admin routes ---------------------------------------------------------------------
def test_weight_routes_need_the_admin_key_and_a_trainable_engine(
    fake_gateway, http, new_session
) -> None:
    root = fake_gateway.url.removesuffix("/v1")
    _, key = new_session(fake_gateway)
    assert_error_shape(http.get(f"{root}/admin/weights"), 401)
    err = assert_error_shape(http.get(f"{root}/admin/weights", headers=bearer(key)), 403)
    assert err["code"] == "admin_key_required"
    info = http.get(f"{root}/admin/weights", headers=admin_headers()).json()
    assert info == {
        "engine": "fake",
        "policy_version": 0,
        "ranks": 0,
        "devices": [],
        "group_id": None,
    }
    # the fake engine takes no push: a clear 400, and the trainer's push says so
    body = {"group": {"host": "127.0.0.1", "port": 1, "world_size": 2}, "first_rank": 1}
    err = assert_error_shape(
        http.post(f"{root}/admin/weights/group", headers=admin_headers(), json=body), 400
    )
    assert err["code"] == "weight_push_unsupported"
    with pytest.raises(WeightPushError, match="takes no weight push"):
        push_weights([fake_gateway.url], ADMIN_KEY, 1, {"w": torch.zeros(2)})
    # a load from a folder that is not there: a 503 in OpenAI's shape, version kept
    err = assert_error_shape(
        http.post(
            f"{root}/admin/weights",
            headers=admin_headers(),
            json={"version": 1, "path": "/nonexistent"},
        ),
        (400, 503),
    )
    assert http.get(f"{root}/admin/weights", headers=admin_headers()).json()["policy_version"] == 0


# ---- a gateway in its own process --------------------------------------------------------
def greedy_turn(http: httpx.Client, root: str, admin: str, max_tokens: int = 8) -> dict[str, Any]:
    """One greedy chat turn in a new session; its record (prompt, output, versions)."""
    r = http.post(f"{root}/v1/sessions", headers=bearer(admin), json={})
    sid, key = r.json()["id"], r.json()["api_key"]
    r = http.post(
        f"{root}/v1/chat/completions",
        headers=bearer(key),
        json={"messages": QUESTION, "max_tokens": max_tokens, "temperature": 0, "logprobs": True},
    )
    assert r.status_code == 200, r.text
    session = http.get(f"{root}/v1/sessions/{sid}", headers=bearer(admin)).json()
    return session["completions"][0]


def forward_logprobs(model: torch.nn.Module, prompt: list[int], out: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(out)[:, None])[:, 0]


def perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """New weights, as a training step would make: every matrix moved a little, the
    tied embedding included (so lm_head must follow it)."""
    gen = torch.Generator().manual_seed(seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    emb = state["model.embed_tokens.weight"]
    for name, t in state.items():
        if t.ndim == 2 and name != "lm_head.weight":
            t += 0.02 * t.abs().mean() * torch.randn(t.shape, generator=gen)
    state["lm_head.weight"] = emb  # tied, as the trainer's state dict has it
    return state


@pytest.mark.slow
def test_push_to_an_embedded_gateway_in_another_process(tmp_path: Path) -> None:
    from gateway.inference.model_source import load_causal_lm, resolve_model_dir

    model = load_causal_lm(resolve_model_dir(None)).eval()
    with (
        Replicas(1, str(tmp_path / "g.db"), tmp_path, ["--engine", "embedded"]) as gw,
        httpx.Client(timeout=300) as http,
    ):
        root = gateway_root(gw.urls[0])
        before = greedy_turn(http, root, gw.admin_key)
        assert before["output_versions"] == [0] * len(before["output_ids"])
        new = perturbed(model, seed=1)
        model.load_state_dict(new)
        prompt = before["prompt_ids"]
        stale = forward_logprobs(model, prompt, before["output_ids"])
        # the new weights answer differently from the served ones: the check below bites
        assert (stale - torch.tensor(before["output_logprobs"])).abs().max() > 1e-2

        with WeightPush([gw.urls[0]], gw.admin_key) as push:
            first = push.push(1, new)
            assert first.tensors == len(new) - 1  # lm_head.weight sent as the embedding
            after = greedy_turn(http, root, gw.admin_key)
            assert after["prompt_ids"] == prompt
            assert after["output_versions"] == [1] * len(after["output_ids"])
            expected = forward_logprobs(model, prompt, after["output_ids"])
            diff = (expected - torch.tensor(after["output_logprobs"])).abs()
            assert diff.mean().item() < 1e-3 and diff.max().item() < 1e-2, diff
            # greedy: the gateway's tokens are the new model's argmax
            ids = torch.tensor([prompt + after["output_ids"]])
            with torch.no_grad():
                argmax = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
            assert argmax == after["output_ids"]

            # a second push reuses the group: back to the starting weights, version 2
            model = load_causal_lm(resolve_model_dir(None)).eval()
            second = push.push(2, model.state_dict())
            assert second.join_s == 0.0
            again = greedy_turn(http, root, gw.admin_key)
            assert again["output_versions"] == [2] * len(again["output_ids"])
            assert again["output_ids"] == before["output_ids"]
            assert again["output_logprobs"] == pytest.approx(before["output_logprobs"], abs=1e-4)
        info = http.get(f"{root}/admin/weights", headers=bearer(gw.admin_key))
        assert info.json()["policy_version"] == 2
        assert info.json()["group_id"] is None  # the trainer left; the gateway serves on
        print(
            f"\npush of {first.bytes / 2**20:.0f} MiB in {first.tensors} tensors: "
            f"{first.seconds:.2f} s (group formed in {first.join_s:.2f} s), "
            f"then {second.seconds:.2f} s"
        )


# ---- the trainer's choice -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("weight_sync", ["push", "disk"])
def test_training_step_reaches_the_engine_by_push_or_by_the_named_disk_path(
    tmp_path: Path, weight_sync: str
) -> None:
    """`gateway.weight_sync: push` sends the step's weights through the gateway's admin
    routes over gloo (the path vLLM servers and gateway.urls take by default), `disk`
    through a folder; either way the engine then holds exactly the trained weights."""
    from trainer_helpers import RandomRewardAgent, rows

    from trainer.api import Trainer

    config = {
        "run_dir": str(tmp_path / "run"),
        "total_steps": 1,
        "rollout": {"batch_size": 1, "group_size": 2},
        "gateway": {"default_max_tokens": 4, "weight_sync": weight_sync},
        "train": {"lr": 1e-3, "zero_stage": 0, "micro_batch_tokens": 1024},
        "workflow_kwargs": {"max_tokens": 4},
    }
    trainer = Trainer(config)
    assert trainer._weight_sync() == weight_sync
    same: list[bool] = []
    sync = trainer._sync_weights

    def sync_and_look(version: int) -> None:  # the engine's weights right after the sync
        sync(version)
        served = trainer.gateway.engine.model.state_dict()
        trained = trainer.policy.full_state_dict()
        same.append(served.keys() == trained.keys())
        same.extend(torch.equal(served[k], trained[k]) for k in trained)

    trainer._sync_weights = sync_and_look
    result = trainer.train(workflow=RandomRewardAgent, dataset=rows(2))
    assert result.policy_version == 1
    assert len(same) > 100 and all(same)
    assert (tmp_path / "run" / "weights").exists() == (weight_sync == "disk")
    assert trainer._push is None or trainer._push._group is None  # left its group at the end


def test_a_weight_sync_nobody_knows_is_a_config_error() -> None:
    from trainer.api.config import ConfigError, TrainerGatewayConfig

    with pytest.raises(ConfigError, match="gateway.weight_sync must be auto, push or disk"):
        TrainerGatewayConfig(weight_sync="nfs")


@pytest.mark.slow
def test_a_gateway_that_left_the_group_fails_the_push_and_the_next_push_rejoins(
    embedded_gateway,
) -> None:
    """A gateway restarted between two steps is no longer in the group: the push fails
    fast with its answer (not at the broadcast's timeout), and the next push forms a
    new group and lands."""
    gw = embedded_gateway
    state = {k: v.detach().clone() for k, v in gw.engine.model.state_dict().items()}
    root = gateway_root(gw.url)
    with WeightPush([gw.url], ADMIN_KEY, timeout_s=120) as push:
        push.push(gw.engine.version + 1, state)
        httpx.delete(f"{root}/admin/weights/group", headers=admin_headers()).raise_for_status()
        started = time.monotonic()
        # the gateway's 409 (not in the group), or its closed connection: either way
        with pytest.raises(WeightPushError, match="weight push failed"):
            push.push(gw.engine.version + 1, state)
        assert time.monotonic() - started < 60
        version = gw.engine.version + 1
        stats = push.push(version, state)
        assert stats.join_s > 0 and gw.engine.version == version
