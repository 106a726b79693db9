"""Held-out evaluation: greedy, never on training prompts, with 95% intervals; the time
budget stops training in time for the final evaluation and still writes everything."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import RandomRewardAgent, make_tiny_model, rows

from trainer.api import Trainer
from trainer.api.config import ConfigError, EvalConfig, load_config
from trainer.evaluation import held_out_rows, mean_interval, summarise, wilson_interval

REPO = Path(__file__).resolve().parent.parent


# ---- the statistics ----------------------------------------------------------------------
def test_wilson_interval_matches_known_values_and_stays_in_range() -> None:
    lo, hi = wilson_interval(32, 64)
    assert lo == pytest.approx(0.3802, abs=1e-3) and hi == pytest.approx(0.6198, abs=1e-3)
    assert wilson_interval(0, 64)[0] == 0.0 and 0.0 < wilson_interval(0, 64)[1] < 0.07
    assert wilson_interval(64, 64)[1] == 1.0
    for n in range(1, 200):  # the plot draws p - lo and hi - p as error bars: never < 0
        for k in (0, 1, n // 2, n - 1, n):
            lo, hi = wilson_interval(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n, lo, hi)


def test_mean_interval_and_summary() -> None:
    lo, hi = mean_interval([0.0, 1.0] * 32)
    assert lo == pytest.approx(0.5 - 1.96 * 0.5040 / 8, abs=1e-3) and hi > 0.5
    r = summarise([1.0, 0.5, 0.0, None], EvalConfig(success_reward=1.0), 3, 3, 1.0)
    assert (r.n, r.accuracy, r.errors) == (4, 0.25, 1)
    assert r.reward_mean == pytest.approx(0.375)
    assert r.accuracy_ci[0] <= r.accuracy <= r.accuracy_ci[1]


def test_held_out_rows_never_include_a_training_prompt() -> None:
    cfg = EvalConfig(
        dataset={"type": "python", "function": "trainer_helpers.rows", "n": 12}, size=4
    )
    held = held_out_rows(cfg, rows(8))
    assert [r["id"] for r in held] == [8, 9, 10, 11]
    with pytest.raises(ValueError, match="only 4 rows"):
        held_out_rows(EvalConfig(dataset=cfg.dataset, size=5), rows(8))
    with pytest.raises(ConfigError):
        load_config(None, ["eval.size=0"])


# ---- through the trainer -----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), tokenizer)


def _config(run_dir: Path, model: Path, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "run_dir": str(run_dir),
        "model": str(model),
        "total_steps": 2,
        "rollout": {"batch_size": 2, "group_size": 2},
        "gateway": {"default_max_tokens": 6},
        "train": {"lr": 1e-3, "micro_batch_tokens": 512},
        "tensorboard": False,
        "eval": {
            "dataset": {"type": "python", "function": "trainer_helpers.rows", "n": 12},
            "size": 4,
            "every": 1,
            "success_reward": 0.5,
        },
        **extra,
    }


def _eval_sessions(db: Path) -> list[tuple[str, str]]:
    """(session metadata, request) of every evaluation completion, the requests read back
    whole (a later turn is stored as a delta on its parent)."""
    from gateway.store.database import open_database
    from gateway.store.repository import Repository

    with sqlite3.connect(db) as conn:
        sessions = conn.execute("SELECT id, metadata FROM sessions WHERE sampling IS NOT NULL")
        sessions = sessions.fetchall()
    repo = Repository(open_database(db))
    return [
        (meta, json.dumps(c["request"])) for sid, meta in sessions for c in repo.completions(sid)
    ]


def test_training_evaluates_before_during_and_after_greedily(tmp_path, tiny_model) -> None:
    result = Trainer(_config(tmp_path / "run", tiny_model)).train(
        workflow=RandomRewardAgent, dataset=rows(8)
    )
    evals = [json.loads(line) for line in (result.run_dir / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1, 2] == [e["step"] for e in result.evals]
    assert [e["policy_version"] for e in evals] == [0, 1, 2]
    for e in evals:
        assert e["n"] == 4 and e["accuracy_ci"][0] <= e["accuracy"] <= e["accuracy_ci"][1]
        assert e["reward_ci"][0] <= e["reward_mean"] <= e["reward_ci"][1]
    recorded = _eval_sessions(result.database)
    assert len(recorded) == 3 * 4 * 2  # 3 evaluations x 4 rows x 2 turns
    for meta, request in recorded:
        assert json.loads(meta)["eval"] is True
        assert json.loads(request)["temperature"] == 0.0  # greedy, whatever the agent asked
    # eval episodes are not training data: the steps trained on 2 groups x 2 each
    metrics = [json.loads(line) for line in result.metrics.read_text().splitlines()]
    assert [m["episodes"] for m in metrics] == [4, 4]
    # eval.every: the best accuracy's weights are kept (the first of equals), or the base won
    best = max(evals, key=lambda e: e["accuracy"])
    assert json.loads(json.dumps(result.best_eval)) == best
    if best["step"] > 0:
        assert result.best_checkpoint == result.run_dir / "checkpoint-best"
        assert json.loads((result.best_checkpoint / "best.json").read_text()) == best
        assert (result.best_checkpoint / "config.json").is_file()
    else:
        assert result.best_checkpoint is None


def test_the_best_checkpoint_is_the_best_accuracy_and_says_which(tmp_path) -> None:
    from types import SimpleNamespace

    saved: list[int] = []

    class Policy:
        world = 1

        def save_hf(self, path, tokenizer=None):  # type: ignore[no-untyped-def]
            path.mkdir(parents=True, exist_ok=True)
            saved.append(current["step"])
            return path

    trainer = Trainer({"run_dir": str(tmp_path)})
    trainer.policy = Policy()
    trainer.gateway = SimpleNamespace(
        state=SimpleNamespace(renderer=SimpleNamespace(tokenizer=None))
    )
    for step, accuracy in [(0, 0.30), (10, 0.50), (20, 0.45), (30, 0.50), (40, 0.20)]:
        current = {
            "step": step,
            "accuracy": accuracy,
            "accuracy_ci": [accuracy - 0.1, accuracy + 0.1],
        }
        trainer._keep_best(current)
    assert saved == [10]  # later equal or worse evaluations keep the earlier weights
    assert json.loads((tmp_path / "checkpoint-best" / "best.json").read_text())["step"] == 10
    assert trainer._best_line() == (
        f"best held-out accuracy: 0.500 [0.400, 0.600] after 10 steps, kept in {tmp_path / 'checkpoint-best'}"
    )
    base_only = Trainer({"run_dir": str(tmp_path / "b")})
    base_only._keep_best({"step": 0, "accuracy": 0.4, "accuracy_ci": [0.3, 0.5]})
    base_only._keep_best({"step": 5, "accuracy": 0.3, "accuracy_ci": [0.2, 0.4]})
    assert "the base policy; no trained step beat it" in base_only._best_line()


def test_time_budget_stops_in_time_for_the_final_evaluation(tmp_path, tiny_model) -> None:
    cfg = _config(tmp_path / "run", tiny_model, total_steps=50, time_budget_s=1.0)
    cfg["eval"]["every"] = 0
    result = Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows(8))
    assert result.stopped_early
    steps = len(result.metrics.read_text().splitlines())
    assert 1 <= steps < 50
    assert [e["step"] for e in result.evals] == [0, steps]  # base, then final
    assert (result.checkpoint / "config.json").exists()
    assert result.reward_curve.exists()


def test_min_steps_holds_the_time_budget_off_until_reached(tmp_path, tiny_model) -> None:
    """A slow machine runs min_steps steps even when the budget is spent from the start,
    and stops right after them."""
    cfg = _config(tmp_path / "run", tiny_model, total_steps=50, time_budget_s=1.0)
    cfg["eval"]["every"] = 0
    cfg["min_steps"] = 3
    result = Trainer(cfg).train(workflow=RandomRewardAgent, dataset=rows(8))
    assert result.stopped_early
    assert len(result.metrics.read_text().splitlines()) == 3
    assert [e["step"] for e in result.evals] == [0, 3]


def test_turnstile_eval_cli_scores_a_checkpoint(tmp_path, tiny_model) -> None:
    cfg = _config(tmp_path / "run", tiny_model)
    cfg["workflow"] = "trainer_helpers.RandomRewardAgent"
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))  # YAML is a superset of JSON
    out = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "eval", "--config", str(tmp_path / "c.yaml"),
         "--checkpoint", str(tiny_model), "eval.size=3"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "accuracy" in out.stdout and "(n=3)" in out.stdout
    saved = json.loads((tmp_path / "run" / f"eval-{tiny_model.name}.json").read_text())
    assert saved["n"] == 3 and saved["model"] == str(tiny_model)
