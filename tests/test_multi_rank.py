"""Data-parallel training on 2 CPU ranks (gloo), launched by torchrun or the deepspeed
launcher as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from trainer_helpers import make_tiny_model

from gateway.server import free_port

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


def _launch(launcher: str, port: int) -> list[str]:
    if launcher == "torchrun":
        return [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(port), "-m", "trainer.cli",
        ]  # fmt: skip
    return [
        str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2",
        "--master_port", str(port), "--module", "trainer.cli",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("launcher", "zero_stage"), [("torchrun", 2), ("torchrun", 3), ("deepspeed", 2)]
)
def test_two_ranks_train_share_batches_and_checkpoint(
    tmp_path, tiny_model, launcher, zero_stage
) -> None:
    run_dir = tmp_path / "run"
    config = {
        "run_dir": str(run_dir),
        "model": str(tiny_model),
        "total_steps": 3,
        "workflow": str(REPO / "tests" / "trainer_helpers.py") + ":RandomRewardAgent",
        "dataset": {
            "type": "python",
            "function": "agents/math_task.py:arithmetic_word_problems",
            "size": 16,
            "seed": 0,
        },
        "rollout": {"batch_size": 2, "group_size": 2, "max_staleness": 1},
        "gateway": {"default_max_tokens": 6},
        "train": {"lr": 1e-3, "zero_stage": zero_stage, "micro_batch_tokens": 96},
        "checkpoint_every": 3,
        "tensorboard": False,
    }
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    dist_vars = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [*_launch(launcher, free_port()), "train", "--config", str(cfg_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("policy version    3") == 1  # rank 0 reports, once
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["world_size"] == 2 for m in metrics)
    assert all(m["micro_batches"] >= 2 for m in metrics)  # something for each rank
    shards = sorted(p.name for p in (run_dir / "checkpoints" / "step3").glob("*optim_states.pt"))
    assert shards == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    assert (run_dir / "checkpoint" / "config.json").is_file()
