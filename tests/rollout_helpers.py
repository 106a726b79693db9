"""A real store (SQLite, its batched recorder) for token-level runners in unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.serving.direct import DirectRecorder
from gateway.store.database import open_database
from gateway.store.recorder import Recorder
from gateway.store.repository import Repository


@contextmanager
def token_store(folder: Path) -> Iterator[DirectRecorder]:
    """Where a `RolloutEngine(..., recorder=...)` records its episodes' sessions."""
    db = open_database(folder / "store.db")
    recorder = Recorder(db)
    recorder.start()
    try:
        yield DirectRecorder(Repository(db), recorder, "test", 3600)
    finally:
        recorder.stop()
        db.dispose()
