"""Three `turnstile serve` replicas sharing one PostgreSQL server, each request of a
session sent to a random replica (fake engine): nothing is lost or linked wrong, retries
are answered once, rewards race completions, ended and expired keys stop everywhere,
and a replica killed with SIGKILL mid-load loses none of its 200s and restarts cleanly.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest

from bench.replicas import (
    RETRY_HEADER,
    Agents,
    Replicas,
    create_session,
    lost_or_wrong,
    stored_completions,
)

pytestmark = pytest.mark.slow

SESSIONS, TURNS = 64, 8


@pytest.fixture(scope="module")
def replicas(postgres, tmp_path_factory):
    """One cluster for the module (starting three replicas takes ~30 s on 2 cores); each
    test looks only at its own sessions, and the kill test restarts what it kills."""
    work = tmp_path_factory.mktemp("replicas")
    with Replicas(3, postgres.create_database(), work, ["--fake-delay-s", "0.02"]) as r:
        yield r


async def _chat(http, url, key, messages, retry=0):
    headers = {"Authorization": f"Bearer {key}", RETRY_HEADER: str(retry)}
    async with http.post(f"{url}/chat/completions", json={"messages": messages},
                         headers=headers) as r:  # fmt: skip
        return r.status, await r.json()


async def test_64_sessions_of_8_turns_across_three_replicas(replicas) -> None:
    agents = Agents(replicas, SESSIONS, TURNS, retry_every=4, rewards=True, seed=1)
    outcome = await agents.run()

    assert Counter(s.status for s in outcome.sent) == {200: SESSIONS * TURNS}
    # every replica served a fair share: requests really were spread
    assert all(n > SESSIONS * TURNS / 6 for n in Counter(s.replica for s in outcome.sent).values())
    stored = stored_completions(replicas.database)
    assert lost_or_wrong(outcome, stored) == []
    # retries reached another replica and were answered from the record: no new row
    assert outcome.retries_other_id == []
    assert outcome.retries_same_id == SESSIONS * (TURNS // 4)
    mine = [c for c, row in stored.items() if row["session_id"] in agents.session_keys]
    assert len(mine) == SESSIONS * TURNS
    # every reward (posted twice, through two other replicas, racing later turns) is set
    assert all(stored[cid]["reward"] == value for cid, value in outcome.rewards.items())
    assert len(outcome.rewards) == SESSIONS * TURNS

    # ending a session through one replica: within the key cache's 2 s, every replica 410s
    async with aiohttp.ClientSession() as http:
        (sid, key), *_ = agents.session_keys.items()
        admin = {"Authorization": f"Bearer {replicas.admin_key}"}
        async with http.post(f"{replicas.urls[1]}/sessions/{sid}/end", headers=admin) as r:
            assert r.status == 200, await r.text()
        await asyncio.sleep(2.5)
        for url in replicas.urls:
            status, body = await _chat(http, url, key, [{"role": "user", "content": "more?"}])
            assert status == 410 and body["error"]["code"] == "session_ended", body


async def test_a_retry_reaching_another_replica_while_the_original_generates(
    postgres, tmp_path
) -> None:
    """The original takes 1.5 s on replica 0; its retry reaches replica 1 after 0.3 s.
    Both answers are the same completion, stored once."""
    db = postgres.create_database()
    with Replicas(2, db, tmp_path, ["--fake-delay-s", "1.5"]) as replicas:
        async with aiohttp.ClientSession() as http:
            sid, key = await create_session(http, replicas.urls[0], replicas.admin_key)
            messages = [{"role": "user", "content": "A slow question."}]
            original = asyncio.ensure_future(_chat(http, replicas.urls[0], key, messages))
            await asyncio.sleep(0.3)
            retry = await _chat(http, replicas.urls[1], key, messages, retry=1)
            first = await original
    assert first[0] == retry[0] == 200, (first, retry)
    assert retry[1]["id"] == first[1]["id"]
    stored = stored_completions(db)
    assert [cid for cid, row in stored.items() if row["session_id"] == sid] == [first[1]["id"]]


async def test_an_expired_key_stops_on_every_replica(replicas) -> None:
    async with aiohttp.ClientSession() as http:
        _, key = await create_session(http, replicas.urls[0], replicas.admin_key, ttl_seconds=3)
        messages = [{"role": "user", "content": "Quick."}]
        for url in replicas.urls:  # every replica serves it, and caches it
            assert (await _chat(http, url, key, messages))[0] == 200
        await asyncio.sleep(3.5)
        for url in replicas.urls:
            status, body = await _chat(http, url, key, messages)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", body


async def test_a_replica_killed_mid_load_loses_nothing_and_restarts(replicas) -> None:
    agents = Agents(replicas, SESSIONS, TURNS, rewards=False, seed=2)
    run = asyncio.ensure_future(agents.run())
    while len(agents.outcome.sent) < SESSIONS * TURNS // 3:
        await asyncio.sleep(0.05)
    agents.down.add(0)
    replicas.kill(0)  # SIGKILL, with requests in flight on it
    killed_at = len(agents.outcome.sent)
    outcome = await run

    assert Counter(s.status for s in outcome.sent) == {200: SESSIONS * TURNS}
    assert len(outcome.sent) > killed_at + SESSIONS  # the others kept serving
    assert lost_or_wrong(outcome, stored_completions(replicas.database)) == []

    started_in = replicas.restart(0)
    agents.down.clear()
    async with aiohttp.ClientSession() as http:
        _, key = await create_session(http, replicas.urls[0], replicas.admin_key)
        status, _ = await _chat(http, replicas.urls[0], key, [{"role": "user", "content": "Hi"}])
    assert status == 200 and started_in < 120
