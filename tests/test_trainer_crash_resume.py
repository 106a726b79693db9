"""A trainer killed with SIGKILL mid-run: `resume` continues from its last checkpoint,
and no session is trained twice (each step's sessions are in metrics.jsonl)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_helpers import RandomRewardAgent, make_tiny_model, rows

from trainer.api import Trainer

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from trainer_helpers import RandomRewardAgent, rows
from trainer.api import Trainer
Trainer(json.loads(sys.argv[2])).train(workflow=RandomRewardAgent, dataset=rows(5))
"""
STEPS = 5


def _config(run_dir: Path, model: Path, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "run_dir": str(run_dir),
        "model": str(model),
        "total_steps": STEPS,
        "seed": 7,
        "rollout": {"batch_size": 2, "group_size": 2},
        "gateway": {"default_max_tokens": 6},
        "train": {"lr": 1e-3, "micro_batch_tokens": 512},
        "checkpoint_every": 1,
        **extra,
    }


def _metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_killed_trainer_resumes_and_trains_no_session_twice(tmp_path, tokenizer) -> None:
    model = make_tiny_model(tmp_path / "tiny", tokenizer)
    run_dir = tmp_path / "run"
    config = _config(run_dir, model)
    # not the test process's torch.distributed variables: an in-process trainer earlier in
    # the session left MASTER_PORT pointing at a port this process still listens on
    dist_vars = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    env["PYTHONPATH"] = str(TESTS.parent)
    proc = subprocess.Popen([sys.executable, "-c", RUN, str(TESTS), json.dumps(config)], env=env)
    try:
        deadline = time.monotonic() + 600
        while len(_metrics(run_dir / "metrics.jsonl")) < 2:
            assert proc.poll() is None, "the trainer ended before it was killed"
            assert time.monotonic() < deadline, "the trainer made no progress"
            time.sleep(0.2)
        proc.kill()  # SIGKILL: no shutdown, maybe mid-step or mid-checkpoint
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    before = _metrics(run_dir / "metrics.jsonl")
    assert len(before) < STEPS

    result = Trainer({**config, "resume": True}).train(workflow=RandomRewardAgent, dataset=rows(5))
    assert 1 <= result.start_step < STEPS
    after = _metrics(result.metrics)
    assert [m["step"] for m in after] == list(range(1, STEPS + 1))
    # the steps the checkpoint holds are the killed run's own, unchanged
    assert after[: result.start_step] == before[: result.start_step]
    trained = [s for m in after for s in m["sessions"]]
    assert len(trained) == STEPS * 2 * 2  # batch_size x group_size a step
    assert len(set(trained)) == len(trained), "a session was trained twice"
