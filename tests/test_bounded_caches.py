"""Every cache that grows with traffic is a bounded LRU, and what falls out of it is
read back from the database: a long-running gateway neither grows without bound nor
loses a link."""

from __future__ import annotations

import pytest
from gateway_helpers import completion_record, openai_client

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
