"""A training run through gateways it did not start (`gateway.urls`): two `turnstile
serve` replicas with the embedded engine on one PostgreSQL. Each session sticks to one
replica, samples come back from the shared store, and each step's weights reach both
replicas' engines without disk, so every token records the policy version it came from.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from gateway_helpers import recorded
from trainer_helpers import RandomRewardAgent, make_tiny_model, rows

from bench.replicas import Replicas
from trainer.api import Trainer
from trainer.loading import WorkflowError
from trainer.rollout.gateways import RemoteGateways, v1_url

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


def _records_committed(url: str) -> float:
    """What one replica itself committed (its /metrics gauge; the store is shared)."""
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith("turnstile_records_committed "):
            return float(line.split()[1])
    raise AssertionError("no turnstile_records_committed in /metrics")


def _admin_weights(url: str, key: str) -> dict:
    req = urllib.request.Request(
        url.removesuffix("/v1") + "/admin/weights", headers={"Authorization": f"Bearer {key}"}
    )
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


def test_a_run_through_two_replicas_records_each_session_on_its_gateway_at_the_right_version(
    postgres, tmp_path, tiny_model
) -> None:
    database = postgres.create_database()
    extra = ["--engine", "embedded", "--model", str(tiny_model), "--default-max-tokens", "6"]
    with Replicas(2, database, tmp_path / "replicas", extra) as replicas:
        cfg = {
            "run_dir": str(tmp_path / "run"),
            "model": str(tiny_model),
            "total_steps": 2,
            "rollout": {"batch_size": 2, "group_size": 2},
            "gateway": {"urls": replicas.urls, "admin_key": replicas.admin_key},
            "train": {"lr": 1e-3, "micro_batch_tokens": 512},
            "tensorboard": False,
        }
        result = Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows())
        committed = {url: _records_committed(url) for url in replicas.urls}
        served = {url: _admin_weights(url, replicas.admin_key) for url in replicas.urls}

    metrics = [json.loads(line) for line in result.metrics.read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["episodes"] == 4 and m["episode_errors"] == 0 for m in metrics)
    assert all(m["num_samples"] > 0 for m in metrics)  # samples read back from the store
    # both engines serve the last push
    assert {s["policy_version"] for s in served.values()} == {2}

    sessions, completions = recorded(database)
    by_session = Counter(sid for _, sid, _ in completions)
    # every trained session was recorded once (two turns) on the gateway it was sent to,
    # and the replicas shared the sessions out evenly
    trained = [sid for m in metrics for sid in m["sessions"]]
    assert len(trained) == len(set(trained)) == 8
    assert all(by_session[sid] == 2 for sid in trained)
    per_gateway = Counter(sessions[sid]["gateway"] for sid in trained)
    assert per_gateway == {url: 4 for url in replicas.urls}
    for url in replicas.urls:
        mine = [sid for sid in trained if sessions[sid]["gateway"] == url]
        assert committed[url] == sum(by_session[sid] for sid in mine)
    # step 1 sampled version 0, step 2 version 1, on both replicas
    for step, version in ((0, 0), (1, 1)):
        for sid in metrics[step]["sessions"]:
            for _, session_id, versions in completions:
                if session_id == sid:
                    assert versions == {version}, (sid, sessions[sid])
    assert (result.checkpoint / "tokenizer.json").is_file()


def test_gateway_urls_need_the_admin_key_and_distinct_gateways() -> None:
    with pytest.raises(ValueError, match="gateway.admin_key"):
        RemoteGateways(["http://10.0.0.1:8000"], None)
    with pytest.raises(ValueError, match="twice"):
        RemoteGateways(["http://10.0.0.1:8000", "10.0.0.1:8000/v1/"], "key")
    assert v1_url("10.0.0.1:8000") == "http://10.0.0.1:8000/v1"


def test_an_unreachable_gateway_is_named_before_training(tmp_path, tiny_model) -> None:
    from gateway.server import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": str(tiny_model),
        "gateway": {"urls": [url], "admin_key": "k"},
        "tensorboard": False,
    }
    with pytest.raises(ConnectionError, match=url):
        Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows())


def test_token_level_workflows_need_the_trainers_own_gateway(tmp_path, tiny_model) -> None:
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": str(tiny_model),
        "gateway": {"urls": ["http://127.0.0.1:9/v1"], "admin_key": "k"},
        "tensorboard": False,
    }
    with pytest.raises(WorkflowError, match="gateway.urls"):
        Trainer(cfg).train(workflow="agents/remax.py:ReMaxRLVRWorkflow", dataset=rows())


def test_a_gateway_bound_to_every_interface_names_a_reachable_address() -> None:
    """Agents on other nodes get the gateway's URL: never 0.0.0.0."""
    from gateway.config import reachable_host

    assert reachable_host("10.1.2.3") == "10.1.2.3"
    for wildcard in ("0.0.0.0", "::"):
        assert reachable_host(wildcard) not in ("0.0.0.0", "::", "")


def test_the_trainer_starts_replicas_as_ray_actors_and_trains_through_them(
    postgres, tmp_path, tiny_model
) -> None:
    ray = pytest.importorskip("ray", reason="Ray is the optional extra turnstile-rl[ray]")
    database = postgres.create_database()
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "model": str(tiny_model),
        "total_steps": 2,
        "rollout": {"batch_size": 1, "group_size": 2},
        "gateway": {"ray_replicas": 2, "database": database, "default_max_tokens": 6},
        "train": {"lr": 1e-3, "micro_batch_tokens": 512},
        "tensorboard": False,
    }
    try:
        result = Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows())
    finally:
        ray.shutdown()
    metrics = [json.loads(line) for line in result.metrics.read_text().splitlines()]
    assert all(m["episodes"] == 2 and m["episode_errors"] == 0 for m in metrics)
    sessions, completions = recorded(database)
    # two replicas (each its own URL), a session each per step; step 2 sampled version 1
    assert len({meta["gateway"] for meta in sessions.values()}) == 2
    for _, sid, versions in completions:
        step = 0 if sid in metrics[0]["sessions"] else 1
        assert versions == {step}
