"""Runs inside .venv-clients/trackers (wandb + trackio, no torch): logs three steps
through trainer.trackers exactly as the run log does, then reads each tracker's own
local store back and prints what it holds as one JSON line.

Usage: python trackers_offline.py RUN_DIR   (WANDB_MODE=offline, TRACKIO_DIR set)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainer.trackers import make_trackers

STEPS = {1: 0.25, 2: 0.5, 3: 0.75}


def main() -> None:
    run_dir = Path(sys.argv[1])
    trackers = make_trackers(
        ["wandb", "trackio"],
        {"wandb": {"project": "turnstile-test"}, "trackio": {"project": "turnstile-test"}},
        run_dir,
        {"total_steps": 3},
    )
    for step, reward in STEPS.items():
        for t in trackers:
            t.log({"reward/reward_mean": reward, "train/loss": 1.0 / step}, step)
    for t in trackers:
        t.close()
    print(
        "TRACKERS-RESULT "
        + json.dumps({"wandb": wandb_summary(run_dir), "trackio": trackio_logs()})
    )


def wandb_summary(run_dir: Path) -> dict:
    """The history records of the offline run file. wandb 0.31 reads it in its Go core
    only, so its framing (LevelDB's log format: a 7-byte file header, 32 KiB blocks,
    records of crc32c(4) + length(2) + type(1)) is walked here; each record is wandb's
    own protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    [run] = (run_dir / "wandb").glob("offline-run-*")
    [file] = run.glob("*.wandb")
    raw = file.read_bytes()
    assert raw[:4] == b":W&B", raw[:8]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # the rest of a block too short for a header: padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(raw[pos + 4 : pos + 6], "little"), raw[pos + 6]
        pending += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST: a whole record
            records.append(pending)
            pending = b""
        elif kind == 0:
            break
    history = []
    for data in records:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            history.append(items)
    return {"dir": str(run), "history": history}


def trackio_logs() -> list:
    from trackio.sqlite_storage import SQLiteStorage

    [run] = SQLiteStorage.get_runs("turnstile-test")
    return SQLiteStorage.get_logs("turnstile-test", run)


if __name__ == "__main__":
    main()
