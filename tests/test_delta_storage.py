"""Delta storage: a turn stores only what is new on its parent, reads rebuild it whole.

The migration test reads a database written by the code from before delta storage
(tests/fixtures/make_pre_delta_db.py) and compares every read with what that code
answered, byte for byte.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from gateway_helpers import admin_headers, bearer, old_store, openai_client, store_connection

from gateway import json_codec
from gateway.config import GatewayConfig
from gateway.entrypoints.incremental_body import IncrementalBodies
from gateway.inference.fake import FakeEngine
from gateway.server import BackgroundGateway
from gateway.store.database import head_revision
from gateway.store.delta import (
    Full,
    Rebuilder,
    by_id,
    delta_columns,
    same,
    same_items,
    shared_prefix,
)

FIXTURES = Path(__file__).parent / "fixtures"


def test_same_is_json_equality() -> None:
    assert same({"a": [1, "x"]}, {"a": [1, "x"]})
    assert not same(1, 1.0) and not same(1, True) and not same(0.0, -0.0)
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})  # key order is in the bytes


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ([{"a": None}], [{"a": None}, {"b": 1}], True),
        ([{"a": None}], [{"a": float("nan")}], False),  # both `null` in orjson's bytes
        ([{"a": float("nan")}], [{"a": float("nan")}], True),  # two NaN objects
        ([{"a": float("inf")}], [{"a": float("-inf")}], False),
        ([{"a": 1}], [{"a": 1.0}], False),
        ([{"a": [True]}], [{"a": [1]}], False),
        ([{"a": 1}, {"b": 2}], [{"a": 1}], False),  # the old list is the longer
    ],
)
def test_same_items_is_json_equality_of_the_head(old: list, new: list, expected: bool) -> None:
    assert same_items(old, new) is expected


def test_a_history_parsed_whole_is_compared_as_json() -> None:
    """A body parsed whole holds its own objects: its history extends the parent's when
    their JSON says so; a child that changed an earlier message is stored with it."""
    first = {"messages": [{"role": "user", "content": "a"}], "tools": [{"t": 1}]}
    second = {**copy.deepcopy(first), "messages": [*copy.deepcopy(first["messages"]), {"role": "user", "content": "b"}]}  # fmt: skip
    cols = delta_columns(Full(first, [1], [2]), second, [1, 2, 3])
    assert cols["request"]["extend"] == {"messages": [{"role": "user", "content": "b"}]}
    assert cols["request"]["set"] == {}  # the tools, equal copies
    edited = {**second, "messages": [{"role": "user", "content": "A"}, *second["messages"][1:]]}
    cols = delta_columns(Full(second, [1, 2, 3], [4]), edited, [1, 2, 3, 4, 5])
    assert cols["request"]["set"] == {"messages": edited["messages"]}


def test_a_history_holding_its_parents_very_messages_extends_it_without_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body parsed on its parent's (incremental_body.py) holds the parent's message
    objects: that is the proof, nothing is written or compared as JSON."""
    from gateway.store import delta

    compared: list[list] = []
    real = delta.same_items
    monkeypatch.setattr(
        delta, "same_items", lambda old, new: compared.append(old) or real(old, new)
    )
    first = {"messages": [{"role": "user", "content": "a"}]}
    second = {"messages": [*first["messages"], {"role": "user", "content": "b"}]}
    cols = delta_columns(Full(first, [1], [2]), second, [1, 2, 3])
    assert cols["request"]["extend"] == {"messages": [{"role": "user", "content": "b"}]}
    assert compared == []
    # equal objects that are not the parent's are still compared (and found equal)
    third = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "c"}]}
    cols = delta_columns(Full(first, [1], [2]), third, [1, 2, 3])
    assert cols["request"]["extend"] == {"messages": [{"role": "user", "content": "c"}]}
    assert compared == [first["messages"]]


@pytest.mark.parametrize(
    ("a", "b", "n"), [([], [1], 0), ([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 9, 3], 1),
                      (list(range(1000)), [*range(517), -1], 517)],
)  # fmt: skip
def test_shared_prefix(a: list[int], b: list[int], n: int) -> None:
    assert shared_prefix(a, b) == shared_prefix(b, a) == n


def _row(cid: str, parent: str | None, cols: dict[str, Any], output: list[int]) -> dict[str, Any]:
    from gateway.store.codec import pack_ints

    return {"id": cid, "parent_id": parent, "output_ids": pack_ints(output), **cols}


def test_a_delta_rebuilds_the_request_and_prompt_exactly() -> None:
    parent = Full(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7,
         "tools": [{"x": 1}]},
        [1, 2, 3],
        [4, 5],
    )  # fmt: skip
    child_request = {
        "temperature": 1,  # an int now: must come back as 1, not 0.7 or 1.0
        "model": "m",
        "messages": [*parent.request["messages"], {"role": "assistant", "content": "yo"},
                     {"role": "user", "content": "more"}],
        "seed": 3,
    }  # fmt: skip
    cols = delta_columns(parent, child_request, [1, 2, 3, 4, 9, 9])
    assert cols["is_delta"] and cols["prompt_shared"] == 4
    assert "tools" not in json.dumps(cols["request"])  # dropped, and the old messages too
    rows = [
        _row("p", None, delta_columns(None, parent.request, parent.prompt_ids), parent.output_ids),
        _row("c", "p", cols, [7]),
    ]
    full = Rebuilder(by_id(rows)).full(rows[1])
    assert json.dumps(full.request) == json.dumps(child_request)
    assert full.prompt_ids == [1, 2, 3, 4, 9, 9] and full.output_ids == [7]


def test_a_turn_that_continues_nothing_is_stored_whole() -> None:
    parent = Full({"messages": [{"role": "user", "content": "a"}]}, [5, 6], [7])
    cols = delta_columns(parent, {"messages": [{"role": "user", "content": "b"}]}, [8, 6])
    assert not cols["is_delta"] and cols["request"] == {
        "messages": [{"role": "user", "content": "b"}]
    }


def _gateway(tokenizer: Any, db: Path | str, admin_key: str) -> BackgroundGateway:
    engine = FakeEngine(
        reply_ids=tokenizer.encode("The answer is 4.", add_special_tokens=False),
        stop_id=int(tokenizer.eos_token_id),
        encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
    )
    config = GatewayConfig(port=0, database=str(db), admin_key=admin_key, engine="fake")
    return BackgroundGateway(config, engine=engine).start()


# Keys the session read gained after the fixture was written (issue 10: the session's
# prompt mode, now `prompt_mode`, per-completion `diagnostics`, parse-failure and drift counts; issue 11:
# `side_request`; issue 12: `quotas`). Only these may differ; everything that was there must read back exactly.
LATER_SESSION_KEYS = {"prompt_mode", "quotas"}
LATER_COMPLETION_KEYS = {"diagnostics", "side_request"}
LATER_STATS_KEYS = {"tool_parse_failures", "drift_causes", "prompt_drift"}


def _without_later_fields(session: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in session.items() if k not in LATER_SESSION_KEYS}
    out["stats"] = {k: v for k, v in out["stats"].items() if k not in LATER_STATS_KEYS}
    out["completions"] = [
        {k: v for k, v in c.items() if k not in LATER_COMPLETION_KEYS} for c in out["completions"]
    ]
    return out


def _pre_delta_store(tmp_path: Path, store_backend: str, new_database: Any) -> str:
    """The fixture database on this backend: the SQLite file itself, or its rows copied
    into a PostgreSQL database built by the old migrations to the fixture's own revision
    (0003)."""
    db = tmp_path / "old.db"
    shutil.copy(FIXTURES / "pre_delta.db", db)
    if store_backend == "sqlite":
        return str(db)
    url = new_database()
    old_store(url, "0003")
    target = sa.create_engine(url)
    source = sa.create_engine(f"sqlite:///{db}")
    try:
        old, new = sa.MetaData(), sa.MetaData()
        old.reflect(source)
        new.reflect(target)
        with source.connect() as src, target.begin() as dst:
            for name in ("sessions", "completions"):
                rows = [dict(r._mapping) for r in src.execute(sa.select(old.tables[name]))]
                dst.execute(sa.insert(new.tables[name]), rows)
    finally:
        source.dispose()
        target.dispose()
    return url


@pytest.mark.both_stores
def test_a_pre_delta_database_reads_the_same_after_migration(
    tmp_path, tokenizer, store_backend, new_database
) -> None:
    db = _pre_delta_store(tmp_path, store_backend, new_database)
    before = json.loads((FIXTURES / "pre_delta_reads.json").read_text())
    old_bytes = _stored_bytes(db)
    gw = _gateway(tokenizer, db, "admin-fixture")  # opening it migrates it
    try:
        headers = {"Authorization": "Bearer admin-fixture"}
        with httpx.Client(timeout=60, headers=headers) as http:
            for sid, reads in before.items():
                got = http.get(f"{gw.url}/sessions/{sid}").json()
                assert _without_later_fields(got) == json.loads(reads["get"])
                for style in ("individual", "concat"):
                    r = http.get(f"{gw.url}/sessions/{sid}/export",
                                 params={"style": style, "turn_discount": 0.9})  # fmt: skip
                    assert r.text == reads[style], (sid, style)
    finally:
        gw.stop()
    with store_connection(db) as con:
        kinds = {
            bool(k): n
            for k, n in con.execute(
                sa.text("SELECT is_delta, count(*) FROM completions GROUP BY is_delta")
            )
        }
        assert (
            con.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
            == head_revision()
        )
    # the fixture's turns that continue their parent became deltas; the roots, the
    # edited history and the first previous_response_id turn's new key stayed whole
    assert kinds[True] >= 8 and kinds[False] >= 4, kinds
    assert _stored_bytes(db) < old_bytes


def _stored_bytes(db: str) -> int:
    with store_connection(db) as con:
        return con.execute(
            sa.text(
                "SELECT sum(length(CAST(request AS TEXT)) + length(prompt_ids)) FROM completions"
            )
        ).scalar()


@pytest.mark.both_stores
def test_a_long_session_is_stored_once_and_read_back_whole(fake_gateway, new_session) -> None:
    """Stored bytes grow with the conversation, not with turns x conversation; every
    turn reads back with the exact request it sent."""
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You help. " * 50}]
    sent = []
    bodies = fake_gateway.app.state.gateway.bodies
    bodies.min_bytes = 0  # (this session's bodies stay under the size where it pays)
    reused_before = bodies.reused
    for turn in range(24):
        messages.append({"role": "user", "content": f"Tool output {turn}: " + "x y z " * 60})
        reply = client.chat.completions.create(model="default", messages=messages)
        sent.append([dict(m) for m in messages])
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    with httpx.Client(timeout=60) as http:
        got = http.get(f"{fake_gateway.url}/sessions/{session_id}", headers=admin_headers())
        own = http.get(f"{fake_gateway.url}/sessions/{session_id}", headers=bearer(key))
    assert got.status_code == own.status_code == 200
    completions = got.json()["completions"]
    assert [c["request"]["messages"] for c in completions] == sent
    for parent, child in zip(completions, completions[1:], strict=False):
        assert child["parent_id"] == parent["id"] and child["tokens_continue_parent"] is True
        assert child["prompt_ids"][: len(parent["prompt_ids"])] == parent["prompt_ids"]
    with store_connection(fake_gateway.config.database) as con:
        stored, deltas = con.execute(sa.text(
            "SELECT sum(length(CAST(request AS TEXT)) + length(CAST(response AS TEXT))"
            " + length(prompt_ids) + length(output_ids) + length(output_logprobs)"
            " + length(output_versions)), sum(CASE WHEN is_delta THEN 1 ELSE 0 END)"
            " FROM completions WHERE session_id = :sid"), {"sid": session_id},
        ).one()  # fmt: skip
    last = completions[-1]
    final = 4 * (len(last["prompt_ids"]) + len(last["output_ids"])) + len(
        json.dumps(last["request"])
    )
    assert deltas == len(completions) - 1
    assert stored <= 1.5 * final, (stored, final)
    # the SDK's bodies were parsed on their previous one from the second turn on, and
    # what was recorded is what was sent (above)
    assert bodies.reused - reused_before == 23
    bodies.min_bytes = IncrementalBodies(1, 1).min_bytes


def test_one_row_rebuilt_in_place_equals_the_session_walk() -> None:
    """A chain whose turns share all, part of, or none of their parent's tokens."""
    fulls = [Full({"messages": ["a"], "t": 1}, [1, 2, 3], [4, 5])]
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 7], [1, 2, 7, 8, 9, 9], [5, 5]]
    rows = [_row("r0", None, delta_columns(None, fulls[0].request, [1, 2, 3]), [4, 5])]
    for i, prompt in enumerate(prompts, 1):
        request = {"messages": [*fulls[-1].request["messages"], str(i)], "t": i}
        cols = delta_columns(fulls[-1], request, prompt)
        rows.append(_row(f"r{i}", f"r{i - 1}", cols, [10 + i]))
        fulls.append(Full(request, prompt, [10 + i]))
    assert [r["is_delta"] for r in rows] == [False, True, True, True, True]
    walk = Rebuilder(by_id(rows))
    for row, want in zip(rows, fulls, strict=True):
        alone = Rebuilder(by_id(rows)).one(row)
        assert alone == walk.full(row) == want


def test_the_recorded_request_is_the_dump_with_the_history_not_copied() -> None:
    """Chat turns record their messages list itself, not a copy: the same keys, order
    and JSON as `model_dump(exclude_none=True)`, extras and defaults included."""
    from gateway.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from gateway.serving.turn import recorded_request

    body = {
        "messages": [{"role": "user", "content": "hi", "name": None}],
        "x_extra": {"a": [1, 2.0, None]},
        "temperature": None,
        "model": "m",
        "logprobs": True,
        "stop": ["</s>"],
    }
    req = ChatCompletionRequest.model_validate_json(json.dumps(body))
    dumped = req.model_dump(exclude_none=True)
    recorded = recorded_request(req, "messages")
    assert list(recorded) == list(dumped)
    assert json_codec.dumps(recorded) == json_codec.dumps(dumped)
    assert recorded["messages"] is req.messages


@pytest.mark.parametrize(
    ("module", "model", "field", "body"),
    [
        (
            "gateway.entrypoints.anthropic.messages.protocol",
            "MessagesRequest",
            "messages",
            {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
             "system": "be brief", "x_extra": 1},
        ),
        (
            "gateway.entrypoints.openai.responses.protocol",
            "ResponsesRequest",
            "input",
            {"input": [{"role": "user", "content": "hi"}], "model": "m", "x_extra": [None]},
        ),
        ("gateway.entrypoints.openai.responses.protocol", "ResponsesRequest", "input",
         {"input": "hi", "instructions": "be brief"}),
    ],
)  # fmt: skip
def test_every_endpoint_records_its_request_as_its_dump(module, model, field, body) -> None:
    """Anthropic's messages and the Responses input are recorded the same way."""
    import importlib

    from gateway.serving.turn import recorded_request

    cls = getattr(importlib.import_module(module), model)
    req = cls.model_validate_json(json.dumps(body))
    dumped = req.model_dump(exclude_none=True)
    recorded = recorded_request(req, field)
    assert list(recorded) == list(dumped)
    assert json_codec.dumps(recorded) == json_codec.dumps(dumped)
    assert recorded[field] is getattr(req, field)
