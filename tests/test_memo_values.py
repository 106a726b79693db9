"""Every memo's "nobody changes what I keep" is enforced, not promised (issue 32).

For each memo of the gateway, what a caller could change (what it was handed, what it
handed in) is changed, or is refused; the memo then still answers what it would have
computed afresh. The template's normalised messages: tests/test_incremental_prompts.py;
the parsed bodies a session's next body is built on: tests/test_incremental_body.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
from typing import Any

import orjson
import pytest
from anthropic_helpers import BASH, post_messages
from gateway_helpers import FAKE_REPLY

from gateway.auth import KeyRing
from gateway.chat.prompt_heads import HeadCache
from gateway.entrypoints.anthropic.messages.protocol import MessagesRequest
from gateway.entrypoints.anthropic.messages.serving import MessagesServing
from gateway.frozen import FrozenDict, FrozenList, freeze
from gateway.lru import HistoryMemo
from gateway.store.repository import SessionInfo
from gateway.ui.tokens import TokenTexts

CALL_TEXT = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls", "timeout": 5}}\n</tool_call>'
)


def test_frozen_values_read_as_json_and_refuse_every_change() -> None:
    value = {"role": "user", "content": [{"type": "text", "text": "hi"}], "n": 1, "x": None}
    frozen = freeze(value)
    assert frozen == value and isinstance(frozen, dict) and isinstance(frozen["content"], list)
    assert freeze(frozen) is frozen  # frozen already: handed back as it is
    assert json.dumps(frozen) == json.dumps(value) and orjson.dumps(frozen) == orjson.dumps(value)
    for change in (
        lambda: frozen.__setitem__("role", "system"),
        lambda: frozen.update(role="system"),
        lambda: frozen.pop("role"),
        lambda: frozen.setdefault("name", "x"),
        lambda: frozen.clear(),
        lambda: frozen["content"].append({}),
        lambda: frozen["content"].__setitem__(0, {}),
        lambda: frozen["content"][0].__delitem__("text"),
        lambda: frozen["content"].sort(),
    ):
        with pytest.raises(TypeError):
            change()
    assert frozen == value
    # copies are the caller's own, and plain
    own = dict(frozen)
    own["role"] = "system"
    parts = list(frozen["content"])
    parts.append({})
    assert type({**frozen}) is dict and frozen["role"] == "user" and len(frozen["content"]) == 1
    for twin in (copy.deepcopy(frozen), pickle.loads(pickle.dumps(frozen))):
        assert twin == value and type(twin) is FrozenDict and type(twin["content"]) is FrozenList
    with pytest.raises(TypeError):
        freeze({"ids": {1, 2}})  # not JSON: a memo must not keep it


def test_history_memo_keeps_only_frozen_histories_and_hands_out_frozen_values() -> None:
    memo: HistoryMemo[list[dict[str, Any]]] = HistoryMemo(4)
    plain = [{"role": "user", "content": "q"}]
    assert memo.put(plain, [{"n": 1}]) == [{"n": 1}]
    assert memo.get(plain) is None  # its messages could change under the memo: not kept
    history = freeze(plain)
    kept = memo.put(history, [{"n": 1, "parts": [1]}])
    assert type(kept) is FrozenList and memo.get(history) == (1, kept)
    with pytest.raises(TypeError):
        kept[0]["parts"].append(2)  # what the caller was handed
    with pytest.raises(TypeError):
        history[0]["content"] = "changed"  # what the caller handed in
    assert memo.get(FrozenList([*history, freeze({"role": "user", "content": "more"})])) == (
        1,
        [{"n": 1, "parts": [1]}],
    )
    assert memo.get(freeze([{"role": "user", "content": "q"}])) is None  # equal, not the same


class _Repo:
    def __init__(self, info: SessionInfo) -> None:
        self.info = info

    def session_by_key_hash(self, _digest: str) -> SessionInfo:
        return self.info


def test_session_key_cache_hands_every_request_the_same_frozen_session() -> None:
    meta = {"task": "t1", "tags": ["a"]}
    info = SessionInfo("s1", 2e9, None, meta, 0.0, sampling={"temperature": 0.5}, quotas={"x": 1})
    keys = KeyRing(_Repo(info), None)  # type: ignore[arg-type]

    async def twice() -> tuple[SessionInfo | None, SessionInfo | None]:
        return await keys.session_for_key("tsk-1"), await keys.session_for_key("tsk-1")

    first, second = asyncio.run(twice())
    assert first is second and first is not None  # the second from the cache
    for change in (
        lambda: first.meta.__setitem__("task", "t2"),
        lambda: first.meta["tags"].append("b"),
        lambda: first.sampling.update(temperature=2.0),  # type: ignore[union-attr]
        lambda: first.quotas.pop("x"),  # type: ignore[union-attr]
    ):
        with pytest.raises(TypeError):
            change()
    meta["task"] = "changed by the store's reader"  # the object it was read into
    assert first.meta == {"task": "t1", "tags": ["a"]}  # the cache kept its own copy


def test_prompt_heads_hand_out_ids_the_cache_does_not_share() -> None:
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    cache = HeadCache(encode, ["<|sep|>"], min_chars=8)
    text = "a long shared head<|sep|>tail"
    for _ in range(3):  # seen, checked and kept, used
        ids = cache.encode(text)
        assert ids == encode(text)
        ids.clear()  # a caller that reuses the list it was handed
        ids.append(0)
    assert cache.hits == 1
    assert cache.encode(text) == encode(text)


def test_token_texts_hand_out_lists_the_cache_does_not_share(tokenizer) -> None:
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("Hello there, world", add_special_tokens=False)
    first = texts.texts(ids)
    first[0] = "changed"
    first.append("more")
    assert texts.texts(ids) == [tokenizer.decode([i]) for i in ids]


def test_anthropic_memos_keep_frozen_values(fake_gateway, new_session, http) -> None:
    """The chat form of a history (`chat_of`) is frozen, so the turn that is handed it
    cannot change the next turn's; the generated tool arguments are kept frozen and
    handed out as the caller's own dict."""
    gw = fake_gateway
    session_id, key = new_session(gw)
    gw.engine.script(CALL_TEXT, FAKE_REPLY)
    question = [{"role": "user", "content": "List the files."}]
    body = {"model": "m", "max_tokens": 200, "system": "Be brief.", "messages": question}
    msg = post_messages(http, gw.url, key, {**body, "tools": [BASH]}).json()
    tool_id = msg["content"][0]["id"]
    serving = gw.state.serving(MessagesServing)

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, gw.loop).result(timeout=30)

    found = on_loop(serving._tool_arguments(session_id, [tool_id]))  # noqa: SLF001
    assert json.loads(found[tool_id]) == {"command": "ls", "timeout": 5}
    kept = dict(found)
    found[tool_id] = "changed by the caller"
    assert on_loop(serving._tool_arguments(session_id, [tool_id])) == kept  # noqa: SLF001

    history = [
        *question,
        {"role": "assistant", "content": msg["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "a"}],
        },
    ]
    raws = [json.dumps({**body, "messages": h}).encode() for h in (question, history)]
    bodies, turns = gw.state.bodies, []
    min_bytes, bodies.min_bytes = bodies.min_bytes, 0
    try:
        for raw in raws:
            req, _ = bodies.parse(MessagesRequest, raw, session_id, "messages")
            turns.append(on_loop(serving.chat_of(req, session_id))[0])
    finally:
        bodies.min_bytes = min_bytes
    first, second = turns
    assert all(a is b for a, b in zip(first, second[: len(first)], strict=False))  # memo hit
    with pytest.raises(TypeError):
        first.append({"role": "user", "content": "more"})
    with pytest.raises(TypeError):
        first[-1]["content"] = "changed"
    assert second[-1]["role"] == "tool" and second[-1]["content"] == "a"
