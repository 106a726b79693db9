"""Every cache that grows with traffic is a bounded LRU, and what falls out of it is
read back from the database: a long-running gateway neither grows without bound nor
loses a link."""

from __future__ import annotations

import time
from operator import itemgetter
from typing import Any

import pytest
from anthropic_helpers import BASH, post_messages
from gateway_helpers import bearer, completion_record, openai_client

from gateway.lru import LRU


def test_lru_keeps_the_most_recently_used() -> None:
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert len(cache) == 2
    with pytest.raises(ValueError, match="at least 1"):
        LRU(0)


@pytest.mark.both_stores
def test_turns_link_after_their_parent_left_a_tiny_cache(gateway_factory, new_session) -> None:
    gw = gateway_factory({"parent_cache_size": 1, "key_cache_size": 1})
    sessions = [new_session(gw) for _ in range(3)]
    firsts = []
    for _, key in sessions:  # three first turns: the caches hold only the last one
        messages = [{"role": "user", "content": "Hello"}]
        reply = openai_client(gw, key).chat.completions.create(model="default", messages=messages)
        firsts.append((messages, reply))
    for (session_id, key), (messages, first) in zip(sessions, firsts, strict=True):
        history = [
            *messages,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Again?"},
        ]
        second = openai_client(gw, key).chat.completions.create(model="default", messages=history)
        rec = completion_record(gw, session_id, second.id)
        assert rec["parent_id"] == first.id
        assert rec["tokens_continue_parent"] is True


def test_lru_bounded_by_weight_evicts_the_oldest_first() -> None:
    cache: LRU[str, list[int]] = LRU(10, max_weight=5, weigh=len)
    cache.put("a", [1, 2])
    cache.put("b", [1, 2])
    cache.put("a", [1, 2, 3])  # replacing re-weighs: 3 + 2
    assert cache.weight == 5 and len(cache) == 2
    cache.put("c", [1])  # 6 > 5: "b" (least recent) goes
    assert cache.get("b") is None and cache.weight == 4
    cache.put("d", list(range(9)))  # heavier than the bound: nothing is kept
    assert len(cache) == 0 and cache.weight == 0


@pytest.mark.both_stores
def test_a_parent_too_heavy_for_the_cache_is_rebuilt_from_the_store(
    gateway_factory, new_session
) -> None:
    """With a token budget smaller than one answer, every parent is a DB read, where it
    is stored as a delta: the link, the token continuation and the read-back hold."""
    gw = gateway_factory({"parent_cache_tokens": 1})
    session_id, key = new_session(gw)
    client = openai_client(gw, key)
    messages = [{"role": "user", "content": "Hello"}]
    ids = []
    for _ in range(3):
        reply = client.chat.completions.create(model="default", messages=messages)
        ids.append(reply.id)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Again?"},
        ]
    assert len(gw.state.stages.prompts.recent) == 0
    for parent, child in zip(ids, ids[1:], strict=False):
        rec = completion_record(gw, session_id, child)
        assert rec["parent_id"] == parent and rec["tokens_continue_parent"] is True
    assert not gw.state.stages.records.inflight  # retry entries live only while generating


def test_lru_drops_a_group_at_once() -> None:
    cache: LRU[tuple[str, int], list[int]] = LRU(3, max_weight=100, weigh=len, group=itemgetter(0))
    cache.put(("a", 1), [1])
    cache.put(("b", 1), [1, 2])
    cache.put(("a", 2), [1, 2, 3])
    cache.put(("b", 2), [1])  # 4 entries > 3: ("a", 1) goes, and leaves its group
    cache.drop_group("a")
    assert cache.items() == [(("b", 1), [1, 2]), (("b", 2), [1])] and cache.weight == 3
    cache.drop_group("a")  # nothing left of it: nothing happens
    cache.pop(("b", 1))
    cache.drop_group("b")
    assert len(cache) == 0 and cache.weight == 0


def _kept_of(gw: Any, session_id: str) -> list[str]:
    """Which of the gateway's per-session memories hold something of `session_id`."""
    state = gw.state
    caches = {
        "parents": state.stages.prompts.recent,
        "answered": state.stages.prompts._answered,  # noqa: SLF001
        "bodies": state.bodies._priors,  # noqa: SLF001
    }
    for handler in state.handlers.values():
        for name in ("_arguments", "_main_model"):
            if hasattr(handler, name):
                caches[name] = getattr(handler, name)
    return sorted(
        name
        for name, cache in caches.items()
        if any(session_id in (key, key[0]) for key, _ in cache.items())
    )


def test_an_ended_session_leaves_nothing_in_memory(gateway_factory, new_session, http) -> None:
    """Sessions end after each episode: a gateway that kept their answers, bodies and
    tool inputs until its LRUs filled would hold thousands of finished sessions' state.
    Ended here, or on another replica of the store (the end poll): all of it goes, and
    only that session's."""
    gw = gateway_factory()
    sessions = [new_session(gw) for _ in range(3)]
    system = {"role": "system", "content": "Be brief. " * 2000}  # a body kept (>= 16 kB)
    for _, key in sessions:
        messages = [system, {"role": "user", "content": "Hello"}]
        for _turn in range(2):
            reply = openai_client(gw, key).chat.completions.create(model="m", messages=messages)
            messages += [
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "Again?"},
            ]
        gw.engine.script(
            '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
        )
        question = [{"role": "user", "content": "List the files."}]
        body = {"model": "m", "max_tokens": 64, "messages": question, "tools": [BASH]}
        assert post_messages(http, gw.url, key, body).json()["stop_reason"] == "tool_use"
    everything = ["_arguments", "_main_model", "answered", "bodies", "parents"]
    assert [_kept_of(gw, s) for s, _ in sessions] == [everything] * 3

    (here, key), (elsewhere, _), (live, _) = sessions
    assert http.post(f"{gw.url}/sessions/{here}/end", headers=bearer(key)).is_success
    assert _kept_of(gw, here) == []
    gw.state.repo.end_session(elsewhere)  # as another replica sharing the store does
    deadline = time.monotonic() + 10 * gw.state.keys.end_poll_s
    while _kept_of(gw, elsewhere) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _kept_of(gw, elsewhere) == []
    assert _kept_of(gw, live) == everything
