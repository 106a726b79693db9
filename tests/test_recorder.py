"""The recorder's hand-off: a caller that stops waiting does not take its record with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.store.database import open_database
from gateway.store.recorder import Recorder
from gateway.store.records import CompletionRecord
from gateway.store.repository import Repository


def _record(cid: str) -> CompletionRecord:
    return CompletionRecord(
        id=cid, session_id="sess-r", endpoint="chat.completions", model="m",
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"id": cid}, prompt_ids=[1, 2, 3], output_ids=[4, 5],
        output_logprobs=[-0.1, -0.2], output_versions=[0, 0], finish_reason="stop",
        prefix_hash="h-" + cid,
    )  # fmt: skip


def test_a_cancelled_wait_still_commits_its_record(tmp_path: Path) -> None:
    engine = open_database(tmp_path / "store.db")
    repo = Repository(engine)
    repo.create_session("sess-r", "digest", 3600, {})
    recorder = Recorder(engine)
    recorder.start()

    async def main() -> None:
        waits = [asyncio.create_task(_wait(recorder, f"c-{i}")) for i in range(20)]
        await asyncio.sleep(0)  # each has queued its record and waits on it
        for w in waits[::2]:
            w.cancel()  # a client that went away
        done = await asyncio.gather(*waits, return_exceptions=True)
        assert sum(isinstance(d, asyncio.CancelledError) for d in done) == 10
        assert all(d is None for d in done[1::2])
        for _ in range(200):  # the cancelled ones were queued: they commit all the same
            if recorder.committed == 20:
                break
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
    finally:
        recorder.stop()
    stored = {c["id"] for c in repo.completions("sess-r")}
    assert stored == {f"c-{i}" for i in range(20)}
    engine.dispose()


async def _wait(recorder: Recorder, cid: str) -> None:
    await recorder.record(_record(cid))
