"""One logger interface for the run log: the trackers named in the YAML each get every
step's scalars (TensorBoard here; wandb offline and trackio in tests/clients, in their
own venv), unknown names are config errors, a missing library says what to install."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from tensorboardX.proto import event_pb2

from trainer.api.config import ConfigError, load_config
from trainer.run_log import RunLog
from trainer.trackers import TRACKERS, TrackerError, make_trackers

ROW = {"step": 1, "reward_mean": 0.5, "loss": 0.25, "step_s": 3.0, "episodes": 4,
       "data_rows": [0, 1], "reward_max": None}  # fmt: skip


def tensorboard_scalars(log_dir: Path) -> dict[tuple[str, int], float]:
    """Scalars in the event files (TFRecord framing: length, crc, data, crc)."""
    out = {}
    for path in log_dir.glob("events.out.tfevents.*"):
        raw, pos = path.read_bytes(), 0
        while pos < len(raw):
            (length,) = struct.unpack("<Q", raw[pos : pos + 8])
            event = event_pb2.Event.FromString(raw[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                out[(v.tag, event.step)] = v.simple_value
    return out


class Recording:
    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []
        self.closed = False

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.logged.append((scalars, step))

    def close(self) -> None:
        self.closed = True


def test_every_tracker_gets_the_same_scalars(tmp_path, monkeypatch):
    mine = Recording()
    monkeypatch.setitem(TRACKERS, "mine", lambda run_dir, opts, cfg, start: mine)
    trackers = make_trackers(["tensorboard", "mine"], {}, tmp_path)
    log = RunLog(tmp_path, trackers=trackers)
    log.append(ROW)
    log.append_eval({"step": 1, "accuracy": 0.75, "reward_mean": 0.6})
    log.close()
    expected = {"reward/reward_mean": 0.5, "train/loss": 0.25, "time/step_s": 3.0,
                "rollout/episodes": 4.0}  # fmt: skip
    assert mine.logged == [(expected, 1), ({"eval/accuracy": 0.75, "eval/reward_mean": 0.6}, 1)]
    assert mine.closed
    tb = tensorboard_scalars(tmp_path / "tensorboard")
    assert {tag: v for (tag, _), v in tb.items()} == pytest.approx(
        {**expected, "eval/accuracy": 0.75, "eval/reward_mean": 0.6}
    )
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_backends_are_chosen_in_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trackers:\n  backends: [tensorboard, wandb]\n  wandb: {project: p}\n")
    cfg = load_config(path)
    assert cfg.tracker_backends() == ["tensorboard", "wandb"]
    assert cfg.trackers.wandb == {"project": "p"}
    assert load_config(path, ["tensorboard=false"]).tracker_backends() == ["wandb"]
    assert load_config(None).tracker_backends() == ["tensorboard"]
    path.write_text("trackers:\n  backends: [tensorboard, mlflow]\n")
    with pytest.raises(ConfigError, match=r"unknown \['mlflow'\]; known: \['tensorboard', 'trackio', 'wandb'\]"):  # fmt: skip
        load_config(path)


def test_a_missing_tracker_library_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(TrackerError, match="pip install wandb"):
        make_trackers(["wandb"], {}, tmp_path)


def test_the_reward_curve_draws_a_step_whose_every_episode_failed(tmp_path) -> None:
    """A step with no reward (all its episodes failed, e.g. their node died) is a gap in
    the curve, not a crash at the end of the run."""
    log = RunLog(tmp_path)
    for step, reward in enumerate([0.5, 0.4, None, 0.6], start=1):
        log.append({"step": step, "reward_mean": reward})
    assert log.plot_rewards().stat().st_size > 0
    log.close()
