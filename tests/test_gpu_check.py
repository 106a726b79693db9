"""bench/gpu_check.sh's CPU dry run: every line of the GPU check, on gloo, fp32, tiny.

The GPU run (CUDA IPC between two processes on one GPU, DeepSpeed bf16 on a
Qwen3-0.6B-shaped model) needs a GPU; this runs the same script with `--dry-run`
(CPU, gloo, fp32, a two-layer model of the same family with the real Qwen3
tokenizer), so the check is known to work before a GPU is lent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    env = dict(os.environ, PYTHON=sys.executable, MASTER_PORT="29571")
    r = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "weight push (gloo, two processes)" in r.stdout
    assert "tokens/s" in r.stdout and "ratio" in r.stdout
    figures = json.loads(out.read_text())
    assert figures["device"] == "CPU (dry run)"
    push, step = figures["push"], figures["step"]
    assert push["transport"] == "gloo" and push["mib"] > 1 and push["push_s"] > 0
    assert step["tokens"] == 2 * 64
    assert step["deepspeed_tokens_per_s"] > 0 and step["bare_tokens_per_s"] > 0
    assert 0.2 < step["ratio"] < 5  # the same work both ways: far apart means a bug
