"""The store failing under a running gateway: a clear 503 `store_unavailable` with
`retry-after`, never a 200 without its record, and serving again once the store is back,
without a restart.

SQLite: the test makes the database files immutable (`chattr +i`: even the gateway's
open file handles can no longer write, as on a disk remounted read-only), or keeps the
database on a small tmpfs and fills it. Both need root, which CI runs as; they are undone
in `finally`. PostgreSQL: the test's own
server is stopped for 10 s while sessions keep sending.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from gateway_helpers import HTTP_TIMEOUT, assert_error_shape, bearer, store_connection

from bench.postgres import PostgresServer

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def _chat(http: httpx.Client, url: str, key: str, text: str = "q") -> httpx.Response:
    return http.post(
        f"{url}/chat/completions",
        headers=bearer(key),
        json={"messages": [{"role": "user", "content": text}]},
    )


def _assert_store_unavailable(r: httpx.Response) -> None:
    err = assert_error_shape(r, 503)
    assert err["code"] == "store_unavailable", err
    assert int(r.headers["retry-after"]) > 0


def _recorded(database: str, ids: list[str]) -> set[str]:
    with store_connection(database) as con:
        rows = con.execute(
            sa.text("SELECT id FROM completions WHERE id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"ids": ids},
        )
        return {r[0] for r in rows}


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs the test may remount read-only or fill."""
    assert os.geteuid() == 0, "these fault tests mount a tmpfs: run them as root (CI does)"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _immutable(db: str, on: bool) -> None:
    # not -shm: it is mapped in memory, and a write to an immutable mapping is SIGBUS
    files = [p for p in (db, db + "-wal") if Path(p).exists()]
    subprocess.run(["chattr", "+i" if on else "-i", *files], check=True)


def test_sqlite_file_turned_read_only_is_503_store_unavailable(
    gateway_factory, new_session, http, tmp_path
) -> None:
    assert os.geteuid() == 0, "chattr +i needs root (CI runs as root)"
    db = str(tmp_path / "gw.db")
    gw = gateway_factory({"database": db})
    _, key = new_session(gw)
    first = _chat(http, gw.url, key, "before")
    assert first.status_code == 200
    _immutable(db, True)
    try:
        refused = [_chat(http, gw.url, key, f"read-only {i}") for i in range(3)]
        for r in refused:
            _assert_store_unavailable(r)
        _assert_store_unavailable(
            http.post(f"{gw.url}/sessions", headers={"Authorization": "Bearer admin-test"})
        )
        assert http.get(f"{gw.url}/models", headers=bearer(key)).status_code == 200
    finally:
        _immutable(db, False)
    after = _chat(http, gw.url, key, "after")  # the same gateway, no restart
    assert after.status_code == 200, after.text
    assert _recorded(db, [first.json()["id"], after.json()["id"]]) == {
        first.json()["id"],
        after.json()["id"],
    }


def test_sqlite_on_a_full_disk_is_503_store_unavailable(
    gateway_factory, new_session, http, tmpfs
) -> None:
    db = str(tmpfs / "gw.db")
    gw = gateway_factory({"database": db})
    _, key = new_session(gw)
    assert _chat(http, gw.url, key).status_code == 200
    filler = tmpfs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to the last byte
        for size in (65536, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        # long prompts: their records need new pages, which cannot be written (the
        # first few may still fit where the WAL overwrites itself)
        answers = [_chat(http, gw.url, key, f"{i} " + "x " * 3000) for i in range(12)]
    finally:
        filler.unlink()
    refused = [r for r in answers if r.status_code != 200]
    assert refused, "the full disk never refused a record"
    for r in refused:
        _assert_store_unavailable(r)
    again = _chat(http, gw.url, key, "x " * 3000)
    assert again.status_code == 200, again.text
    served = [r.json()["id"] for r in answers if r.status_code == 200] + [again.json()["id"]]
    assert _recorded(db, served) == set(served), "a 200 without its record"


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test alone: it gets stopped."""
    with PostgresServer(fsync=False) as server:
        yield server


@pytest.mark.slow
async def test_postgres_stopped_10s_under_load_is_503_then_recovers(
    gateway_factory, own_postgres, new_session
) -> None:
    db = own_postgres.create_database()
    gw = gateway_factory({"database": db})
    keys = [new_session(gw)[1] for _ in range(8)]
    results: list[tuple[float, int, str | None, str | None]] = []  # (t, status, id, code)
    t0 = time.monotonic()
    outage = (2.0, 12.0)  # seconds after t0

    async def session(client: httpx.AsyncClient, key: str) -> None:
        i = 0
        while time.monotonic() - t0 < outage[1] + 6.0:
            r = await client.post(
                f"{gw.url}/chat/completions",
                headers=bearer(key),
                json={"messages": [{"role": "user", "content": f"turn {i}"}]},
            )
            i += 1
            t = time.monotonic() - t0
            if r.status_code == 200:
                results.append((t, 200, r.json()["id"], None))
            else:
                _assert_store_unavailable(r)
                results.append((t, r.status_code, None, r.json()["error"]["code"]))
                await asyncio.sleep(0.2)

    async def outage_of_postgres() -> None:
        await asyncio.sleep(outage[0])
        await asyncio.to_thread(own_postgres.stop, "fast")
        await asyncio.sleep(outage[1] - outage[0])
        await asyncio.to_thread(own_postgres.start)

    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        await asyncio.gather(outage_of_postgres(), *(session(client, k) for k in keys))

    served = [rid for _, status, rid, _ in results if status == 200]
    refused = [t for t, status, _, _ in results if status != 200]
    assert refused, "no request was refused while the store was down"
    assert all(outage[0] <= t <= outage[1] + 5.0 for t in refused), refused
    recovered = [s for t, s, _, _ in results if t > outage[1] + 5.0]
    assert recovered and set(recovered) == {200}, "the gateway did not recover by itself"
    assert _recorded(db, served) == set(served), "a 200 was sent without its record"
