"""The trainer's experiment trackers beyond TensorBoard, each with its real library:
Weights & Biases in offline mode and trackio, through the one interface the run log
uses (trainer/trackers). They run in .venv-clients/trackers (`make clients-setup`),
inside a network namespace with no network at all (`unshare -n`): what they wrote is
read back from their own local files."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from test_clients import REPO, SCRIPTS, client_python

pytestmark = pytest.mark.clients

LOGGED = {1: 0.25, 2: 0.5, 3: 0.75}  # as in scripts/trackers_offline.py


def test_wandb_offline_and_trackio_record_each_step(tmp_path):
    python = client_python("trackers")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "PYTHON"))}
    env.update(
        PYTHONPATH=str(REPO),
        WANDB_MODE="offline",
        WANDB_ERROR_REPORTING="false",  # no crash reports
        WANDB_SILENT="true",
        HF_HUB_OFFLINE="1",
        TRACKIO_DIR=str(tmp_path / "trackio"),
        HOME=str(tmp_path / "home"),  # nothing lands in the user's ~/.config or cache
    )
    proc = subprocess.run(
        ["unshare", "-n", str(python), str(SCRIPTS / "trackers_offline.py"), str(run_dir)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("TRACKERS-RESULT ")]
    result = json.loads(line.removeprefix("TRACKERS-RESULT "))
    wandb_steps = {h["_step"]: h["reward/reward_mean"] for h in result["wandb"]["history"]}
    assert wandb_steps == LOGGED
    assert result["wandb"]["dir"].startswith(str(run_dir / "wandb" / "offline-run-"))
    trackio_steps = {r["step"]: r["reward/reward_mean"] for r in result["trackio"]}
    assert trackio_steps == LOGGED
    assert [r["train/loss"] for r in result["trackio"]] == pytest.approx([1.0, 0.5, 1 / 3])
