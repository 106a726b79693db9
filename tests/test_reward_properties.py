"""Hypothesis properties of the reward-value rule and of the export's discounted returns.

The rule: a reward is a bool, int or float (numpy scalars too, for agents' return
values) that is finite as a float; anything else is refused with a 400 and leaves the
stored reward as it was. The returns: a completion's return is its own reward plus
gamma times the mean of its children's returns, along any tree of turns, whatever order
the rows were inserted in.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from gateway_helpers import ADMIN_KEY, FAKE_REPLY, admin_headers, bearer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

import gateway.app
from gateway.config import GatewayConfig
from gateway.inference.fake import FakeEngine
from gateway.reward_values import finite_reward
from gateway.samples import discounted_returns, export_session

SETTINGS = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ---- the reward-value rule ------------------------------------------------------------
NUMBERS = st.one_of(
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**1023, max_value=2**1100),  # beyond a float
    st.floats(allow_nan=True, allow_infinity=True),
)
NUMPY = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True).map(np.float32),
    st.floats(allow_nan=True, allow_infinity=True).map(np.float64),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
    st.booleans().map(np.bool_),
)
NOT_NUMBERS = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def is_finite_number(value: Any) -> bool:
    if not isinstance(value, (bool, int, float, np.generic)) or isinstance(value, np.str_):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


@SETTINGS
@given(value=st.one_of(NUMBERS, NUMPY, NOT_NUMBERS))
def test_reward_rule(value: Any) -> None:
    got = finite_reward(value)
    if is_finite_number(value):
        assert got == float(value) and type(got) is float
    else:
        assert got is None


@pytest.fixture(scope="module")
def api(tmp_path_factory, tokenizer):
    """An in-process gateway, a session key and one completion of that session."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
        engine = FakeEngine(tokenizer.encode(FAKE_REPLY, add_special_tokens=False), 2)
        db = tmp_path_factory.mktemp("rewards") / "r.db"
        config = GatewayConfig(database=str(db), admin_key=ADMIN_KEY, engine="fake")
        app = gateway.app.create_app(config, engine=engine)
    with TestClient(app) as client:
        r = client.post("/v1/sessions", headers=admin_headers(), json={})
        sid, key = r.json()["id"], r.json()["api_key"]
        chat = client.post(
            "/v1/chat/completions",
            headers=bearer(key),
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        yield client, sid, key, chat.json()["id"]


def stored_reward(client: TestClient, sid: str, key: str) -> float | None:
    return client.get(f"/v1/sessions/{sid}", headers=bearer(key)).json()["completions"][0]["reward"]


JSON_VALUES = st.one_of(
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**1023, max_value=2**1100),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
    st.text(max_size=5),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=2),
)


@SETTINGS
@given(value=JSON_VALUES, form=st.sampled_from(["one", "map", "put"]))
def test_rest_api_applies_the_rule(api, value: Any, form: str) -> None:
    """Accepted exactly when the rule accepts (a string is never a number), stored as
    the float the rule gives; refused with a 400 that leaves the reward as it was."""
    client, sid, key, cid = api
    before = stored_reward(client, sid, key)
    if form == "one":
        r = client.post(
            "/v1/rewards", headers=bearer(key), json={"completion_id": cid, "reward": value}
        )
    elif form == "map":
        r = client.post("/v1/rewards", headers=bearer(key), json={"rewards": {cid: value}})
    else:
        r = client.put(f"/v1/completions/{cid}/reward", headers=bearer(key), json={"reward": value})
    accepted = type(value) in (bool, int, float) and finite_reward(value) is not None
    if accepted:
        assert r.status_code == 200, r.text
        assert r.json()["data"] == [{"completion_id": cid, "reward": float(value)}]
        assert stored_reward(client, sid, key) == float(value)
    else:
        assert r.status_code == 400, r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert stored_reward(client, sid, key) == before


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400", '"0.5"'])
def test_rest_api_refuses_non_finite_json(api, raw: str) -> None:
    client, _, key, cid = api
    body = f'{{"completion_id": "{cid}", "reward": {raw}}}'
    r = client.post(
        "/v1/rewards", headers={**bearer(key), "content-type": "application/json"}, content=body
    )
    assert r.status_code == 400, r.text


# ---- discounted returns along any session tree ----------------------------------------
@st.composite
def session_trees(draw: Any) -> tuple[list[dict[str, Any]], float]:
    """Completions of one session as the store gives them: a random tree of turns, each
    prompt continuing its parent's tokens exactly, random rewards (None: unset)."""
    n = draw(st.integers(min_value=1, max_value=12))
    rewards = st.one_of(st.none(), st.floats(-10, 10), st.integers(-3, 3), st.booleans())
    completions: list[dict[str, Any]] = []
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        head = (
            completions[parent]["prompt_ids"] + completions[parent]["output_ids"]
            if parent is not None
            else []
        )
        new = draw(st.lists(st.integers(3, 999), min_size=1, max_size=3))
        output = draw(st.lists(st.integers(3, 999), min_size=1, max_size=3))
        completions.append(
            {
                "id": f"c{i}",
                "parent_id": None if parent is None else f"c{parent}",
                "created_at": float(i),
                "prompt_ids": head + new,
                "output_ids": output,
                "output_logprobs": [-0.5] * len(output),
                "output_versions": [0] * len(output),
                "reward": draw(rewards),
                "request": {},
                "finish_reason": "stop",
            }
        )
    if all(c["reward"] is None for c in completions):
        completions[-1]["reward"] = 1.0
    gamma = draw(st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0))
    return completions, gamma


def reference_returns(completions: list[dict[str, Any]], gamma: float) -> dict[str, float]:
    """The definition, written recursively: own reward + gamma * mean(children's)."""
    children = {c["id"]: [k for k in completions if k["parent_id"] == c["id"]] for c in completions}

    def ret(c: dict[str, Any]) -> float:
        own = float(c["reward"] or 0.0)
        kids = children[c["id"]]
        return own + gamma * (sum(ret(k) for k in kids) / len(kids) if kids else 0.0)

    return {c["id"]: ret(c) for c in completions}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@SETTINGS
@given(tree=session_trees(), seed=st.integers(0, 2**16))
def test_individual_export_returns_follow_the_tree(tree, seed: int) -> None:
    completions, gamma = tree
    expected = reference_returns(completions, gamma)
    shuffled = completions[:]
    random.Random(seed).shuffle(shuffled)
    for rows in (completions, shuffled):  # the insertion order never matters
        got = {
            s.completion_ids[0]: s.returns for s in export_session("s", rows, "individual", gamma)
        }
        assert got.keys() == expected.keys()
        assert all(close(got[c], expected[c]) for c in expected), (got, expected)
        assert discounted_returns(rows, gamma).keys() == expected.keys()
    if gamma == 0.0:
        assert all(close(expected[c["id"]], float(c["reward"] or 0.0)) for c in completions)


@SETTINGS
@given(tree=session_trees(), seed=st.integers(0, 2**16))
def test_concat_export_returns_follow_each_branch(tree, seed: int) -> None:
    """One sample per leaf; each trained token carries its turn's return along that
    branch (own reward + gamma * the next turn's), whatever the insertion order."""
    completions, gamma = tree
    by_id = {c["id"]: c for c in completions}
    parents = {c["parent_id"] for c in completions}
    leaves = {c["id"] for c in completions if c["id"] not in parents}

    def samples(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], Any]:
        return {tuple(s.completion_ids): s for s in export_session("s", rows, "concat", gamma)}

    got = samples(completions)
    shuffled = completions[:]
    random.Random(seed).shuffle(shuffled)
    again = samples(shuffled)
    assert got.keys() == again.keys()
    assert all(got[k].token_returns == again[k].token_returns for k in got)
    assert {chain[-1] for chain in got} == leaves
    for chain, sample in got.items():
        assert chain[0] in {c["id"] for c in completions if c["parent_id"] is None}
        future, per_turn = 0.0, []
        for cid in reversed(chain):
            future = float(by_id[cid]["reward"] or 0.0) + gamma * future
            per_turn.append(future)
        per_turn.reverse()
        trained = [r for r, m in zip(sample.token_returns, sample.loss_mask, strict=True) if m]
        expected = [
            r for cid, r in zip(chain, per_turn, strict=True) for _ in by_id[cid]["output_ids"]
        ]
        assert len(trained) == len(expected)
        assert all(close(a, b) for a, b in zip(trained, expected, strict=True))
        assert close(sample.returns, per_turn[0])


@SETTINGS
@given(rewards=st.lists(st.floats(-5, 5), min_size=1, max_size=20), gamma=st.floats(0, 1))
def test_a_single_branch_has_the_closed_form(rewards: list[float], gamma: float) -> None:
    """Along one branch both styles give sum_k gamma^(k-i) r_k for turn i."""
    completions = []
    prompt: list[int] = [5]
    for i, r in enumerate(rewards):
        completions.append(
            {
                "id": f"c{i}", "parent_id": f"c{i - 1}" if i else None, "created_at": float(i),
                "prompt_ids": list(prompt), "output_ids": [7], "output_logprobs": [-0.1],
                "output_versions": [0], "reward": r, "request": {}, "finish_reason": "stop",
            }
        )  # fmt: skip
        prompt += [7, 9]
    closed = [
        sum(gamma ** (k - i) * rewards[k] for k in range(i, len(rewards)))
        for i in range(len(rewards))
    ]
    individual = export_session("s", completions, "individual", gamma)
    assert all(close(s.returns, c) for s, c in zip(individual, closed, strict=True))
    (concat,) = export_session("s", completions, "concat", gamma)
    trained = [r for r, m in zip(concat.token_returns, concat.loss_mask, strict=True) if m]
    assert all(close(a, b) for a, b in zip(trained, closed, strict=True))
