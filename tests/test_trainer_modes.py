"""Every way of writing the rollout side trains through the same Trainer.

A tiny random model keeps these fast; the gateway, engine, HTTP and DeepSpeed are real.
The two example YAML configs run through the CLI exactly as the docs say.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import RandomRewardAgent, make_tiny_model, rows

from trainer.api import Trainer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _base(run_dir: Path, model: Path, **extra) -> dict:  # type: ignore[no-untyped-def]
    cfg = {
        "run_dir": str(run_dir),
        "model": str(model),
        "total_steps": 2,
        "rollout": {"batch_size": 2, "group_size": 2},
        "gateway": {"default_max_tokens": 6},
        "train": {"lr": 1e-3, "micro_batch_tokens": 512},
        "tensorboard": False,
    }
    for key, value in extra.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return cfg


def test_concat_export_trains_one_sample_per_leaf_and_counts_fallbacks(
    tmp_path, tiny_model
) -> None:
    cfg = _base(
        tmp_path / "run", tiny_model,
        rollout={"agent": {"export_style": "concat", "turn_discount": 0.9}},
    )  # fmt: skip
    result = Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows())
    for m in _metrics(result.metrics):
        assert m["episode_errors"] == 0 and m["completions"] == 2 * m["episodes"]
        # each 2-turn episode is one joined sample, or two where the second turn drifted
        assert m["concat_samples"] == m["episodes"] + m["concat_fallbacks"]
        assert m["num_samples"] == m["concat_samples"]
        # the run page's throughput chart: tokens through the update, per second of it
        assert m["packed_tokens_per_s"] == m["packed_tokens"] / m["train_s"] > 0
        assert m["trained_tokens_per_s"] == m["trained_tokens"] / m["train_s"] > 0


def test_subproc_mode_trains_a_synchronous_openai_agent(tmp_path, tiny_model) -> None:
    cfg = _base(
        tmp_path / "run", tiny_model, total_steps=1,
        rollout={"agent": {"mode": "subproc", "subproc_max_workers": 2}},
        workflow="agents/math_sync_openai.py:MathSyncOpenAIAgent",
    )  # fmt: skip
    result = Trainer(cfg).train(dataset=_arithmetic(4))
    (m,) = _metrics(result.metrics)
    assert m["episodes"] == 4 and m["episode_errors"] == 0
    assert m["completions"] == 4  # one recorded completion per agent run
    assert result.policy_version == 1


@pytest.mark.slow
def test_ray_mode_trains_with_agents_as_ray_tasks(tmp_path, tiny_model) -> None:
    pytest.importorskip("ray", reason="Ray is the optional extra turnstile-rl[ray]")
    import ray

    cfg = _base(
        tmp_path / "run", tiny_model, total_steps=1,
        rollout={"agent": {"mode": "ray", "num_cpus": 0.5}},
        workflow="agents/math_sync_openai.py:MathSyncOpenAIAgent",
    )  # fmt: skip
    result = Trainer(cfg).train(dataset=_arithmetic(4))
    (m,) = _metrics(result.metrics)
    assert m["episodes"] == 4 and m["episode_errors"] == 0 and m["episode_retries"] == 0
    assert m["completions"] == 4 and m["num_samples"] == 4
    assert result.policy_version == 1
    assert not ray.is_initialized()  # the local cluster it started is gone with the run


def _arithmetic(n: int) -> list[dict]:
    from trainer.datasets import load_dataset

    return load_dataset(
        {"type": "python", "function": "agents/math_task.py:arithmetic_word_problems", "size": n}
    )


def _cli(config: str, run_dir: Path, model: Path, *overrides: str) -> list[dict]:
    # a fresh single-process world: not the one this test process already set up
    dist_vars = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    proc = subprocess.run(
        [
            sys.executable, "-m", "trainer.cli", "train", "--config", config,
            f"run_dir={run_dir}", f"model={model}", "tensorboard=false", *overrides,
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy version" in proc.stdout
    # the run page of the gateway it trained through, with the run's own admin key
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/ui/runs/0\?key=\S+", proc.stdout)
    return _metrics(run_dir / "metrics.jsonl")


def _recorded(database: Path) -> list[tuple[dict, list[dict]]]:
    from gateway.store.database import database_url, open_database
    from gateway.store.repository import Repository

    repo = Repository(open_database(database_url(str(database))))
    return [(s, repo.completions(s["id"])) for s in repo.list_sessions(limit=1000)]


def test_remax_example_runs_from_the_cli(tmp_path, tiny_model) -> None:
    metrics = _cli(
        "agents/remax.yaml", tmp_path / "remax", tiny_model,
        "total_steps=2", "rollout.batch_size=2", "workflow_kwargs.gconfig.max_new_tokens=8",
    )  # fmt: skip
    assert [m["policy_version"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["episodes"] == 2 and m["episode_errors"] == 0
        assert m["completions"] == 4  # a sampled and a greedy answer per prompt
        assert m["trained_tokens"] > 0 and "loss" in m
    # token-level generations are recorded like chat completions: a session per episode
    sessions = _recorded(tmp_path / "remax" / "sessions.db")
    assert len(sessions) == 4
    for _, completions in sessions:
        assert len(completions) == 2
        for c in completions:
            assert c["endpoint"] == "direct" and c["output_ids"]
            assert len(c["output_logprobs"]) == len(c["output_versions"]) == len(c["output_ids"])
        # the sampled answer carries the reward it was trained with; the greedy baseline
        # is kept out of training (a side request, no reward)
        sampled, greedy = sorted(completions, key=lambda c: c["side_request"])
        assert sampled["request"]["temperature"] > 0 and sampled["reward"] is not None
        assert greedy["request"]["temperature"] == 0 and greedy["reward"] is None


def test_queue_agent_example_runs_from_the_cli(tmp_path, tiny_model) -> None:
    metrics = _cli(
        "agents/math_multi_turn_queue.yaml", tmp_path / "queue", tiny_model,
        "total_steps=1", "rollout.batch_size=2", "agent.args.gconfig.max_new_tokens=8",
    )  # fmt: skip
    (m,) = metrics
    assert m["episodes"] == 2 and m["episode_errors"] == 0
    assert m["num_samples"] == 8  # n_samples=4 trajectories per prompt, one group each
    # a wrong first answer gets feedback and a second turn
    assert m["completions"] > 8
    sessions = _recorded(tmp_path / "queue" / "sessions.db")
    assert len(sessions) == 2
    assert sum(len(c) for _, c in sessions) == m["completions"]
    for _, completions in sessions:
        # each of the 4 trajectories' reward is on its last turn; a second turn hangs
        # under the first answer of its own trajectory
        assert sum(c["reward"] is not None for c in completions) == 4
        ids = {c["id"] for c in completions}
        assert all(c["parent_id"] in ids for c in completions if c["parent_id"])
        assert sum(c["parent_id"] is None for c in completions) == 4


def test_training_against_sglang_pushes_each_version_through_disk(tmp_path, tiny_model) -> None:
    from fake_sglang_server import FakeSGLangServer

    with FakeSGLangServer(stop_after=5) as fake:
        cfg = _base(
            tmp_path / "run", tiny_model,
            gateway={"engine": "sglang", "engine_urls": [fake.url]},
        )  # fmt: skip
        result = Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows())
        updates = [b for p, b in fake.requests if p == "/update_weights_from_disk"]
    assert result.policy_version == 2 and fake.weights == 2
    assert [Path(u["model_path"]).name for u in updates] == ["v1", "v2"]
    # the folders SGLang loaded were whole Hugging Face checkpoints (the newest is kept)
    assert (tmp_path / "run" / "weights" / "v2" / "config.json").is_file()
    assert not (tmp_path / "run" / "weights" / "v1").exists()
    metrics = _metrics(result.metrics)
    assert all(m["episode_errors"] == 0 and m["completions"] == 8 for m in metrics)


def test_a_loss_registered_outside_the_package_trains(tmp_path, tiny_model) -> None:
    from safetensors.torch import load_file

    from trainer.algorithm.losses import get_loss

    cfg = _base(
        tmp_path / "run", tiny_model,
        imports=[str(REPO / "tests" / "custom_loss.py")],
        train={"loss": "tallied-reinforce", "advantage": "above-half", "lr": 1e-2},
    )  # fmt: skip
    result = Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows())
    calls = get_loss("tallied-reinforce").__globals__["CALLS"]  # the file's own list
    metrics = _metrics(result.metrics)
    assert calls and sum(calls) == sum(m["trained_tokens"] for m in metrics)
    assert all(m["tally"] > 0 for m in metrics)  # the loss's own stats reach the metrics
    before = load_file(tiny_model / "model.safetensors")
    after = load_file(result.checkpoint / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight moved"
