"""`export_style: concat`: a conversation's turns joined into one trained sequence."""

from __future__ import annotations

import random

import pytest
from gateway_helpers import FAKE_REPLY, admin_headers, assert_error_shape, bearer, read_session

from gateway.chat.template import ChatRenderer
from gateway.inference.fake import FAKE_LOGPROB
from gateway.samples import EXPORT_STYLES, NoRewardError, Sample, export_session
from gateway.samples.concat import concat_samples

G = 0.5


def _c(
    cid: str,
    parent: str | None,
    prompt: list[int],
    output: list[int],
    reward: float | None,
    t: float,
    *,
    version: int = 0,
    temperature: float | None = None,
    finish: str = "stop",
) -> dict:
    return {
        "id": cid,
        "parent_id": parent,
        "prompt_ids": prompt,
        "output_ids": output,
        "output_logprobs": [-0.1 * (i + 1) for i in range(len(output))],
        "output_versions": [version] * len(output),
        "reward": reward,
        "finish_reason": finish,
        "request": {"temperature": temperature},
        "created_at": t,
    }


# root -> a -> a1        a continues root token for token, a1 continues a,
#      \-> b             b too (the agent branched after the first answer).
ROOT = _c("root", None, [1, 2, 3], [10, 11], None, 0.0, version=3)
A = _c("a", "root", [1, 2, 3, 10, 11, 20, 21], [12, 13, 14], 0.5, 1.0, version=4)
B = _c("b", "root", [1, 2, 3, 10, 11, 30], [15], 0.25, 2.0, version=4)
A1 = _c("a1", "a", [1, 2, 3, 10, 11, 20, 21, 12, 13, 14, 22], [16, 17], 1.0, 3.0, version=5)
TREE = [ROOT, A, B, A1]


def _dicts(samples: list[Sample]) -> list[dict]:
    return [s.to_dict() for s in samples]


def test_branching_tree_gives_one_sample_per_leaf_with_shared_root_trained() -> None:
    samples = concat_samples("s", TREE, G)
    assert EXPORT_STYLES["concat"] is concat_samples
    assert _dicts(export_session("s", TREE, "concat", G)) == _dicts(samples)

    # Ordered by the leaf's creation time: b (t=2) before a1 (t=3).
    sb, sa = samples
    assert sb.completion_ids == ["root", "b"]
    assert sb.input_ids == [1, 2, 3, 10, 11, 30, 15]
    assert sb.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert sb.logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, -0.1])
    assert sb.versions == [-1, -1, -1, 3, 3, -1, 4]
    assert sb.reward == 0.25
    assert sb.returns == pytest.approx(0.0 + G * 0.25)
    assert sb.token_returns == pytest.approx([0, 0, 0, G * 0.25, G * 0.25, 0, 0.25])

    assert sa.completion_ids == ["root", "a", "a1"]
    assert sa.input_ids == A1["prompt_ids"] + A1["output_ids"]
    assert sa.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1]
    assert sa.logprobs == pytest.approx(
        [0, 0, 0, -0.1, -0.2, 0, 0, -0.1, -0.2, -0.3, 0, -0.1, -0.2]
    )
    assert sa.versions == [-1, -1, -1, 3, 3, -1, -1, 4, 4, 4, -1, 5, 5]
    assert sa.reward == 1.0
    g_a1 = 1.0
    g_a = 0.5 + G * g_a1
    g_root = 0.0 + G * g_a
    assert sa.returns == pytest.approx(g_root)
    assert sa.token_returns == pytest.approx(
        [0, 0, 0, g_root, g_root, 0, 0, g_a, g_a, g_a, 0, g_a1, g_a1]
    )
    for s in samples:
        assert len(s.input_ids) == len(s.loss_mask) == len(s.logprobs) == len(s.versions)
        assert len(s.token_returns) == len(s.input_ids)
        assert s.meta["concat_fallbacks"] == 0 and s.meta["parent_id"] is None
    assert [s.meta["turns"] for s in samples] == [2, 3]

    for seed in range(6):
        shuffled = TREE[:]
        random.Random(seed).shuffle(shuffled)
        assert _dicts(concat_samples("s", shuffled, G)) == _dicts(samples)


@pytest.mark.parametrize("why", ["drifted_tokens", "other_temperature"])
def test_a_turn_that_does_not_continue_falls_back_to_its_own_sample(why: str) -> None:
    root = _c("root", None, [1, 2, 3], [10, 11], 0.2, 0.0)
    if why == "drifted_tokens":  # history re-tokenised: 11 came back as 99
        temp, prompt = None, [1, 2, 3, 10, 99, 20]
    else:  # the tokens continue, but the logprobs were taken at another temperature
        temp, prompt = 0.7, [1, 2, 3, 10, 11, 20]
    child = _c("child", "root", prompt, [12], None, 1.0, temperature=temp)
    grand = _c("grand", "child", prompt + [12, 21], [13, 14], 1.0, 2.0, temperature=temp)
    samples = concat_samples("s", [grand, child, root], G)

    first, second = samples
    # The parent's chain ends at the break and is still trained, on its own.
    assert first.completion_ids == ["root"]
    assert first.loss_mask == [0, 0, 0, 1, 1]
    assert first.returns == pytest.approx(0.2)
    assert first.meta == {
        "finish_reason": "stop",
        "parent_id": None,
        "concat_fallbacks": 0,
        "turns": 1,
    }
    # The child starts over: its whole prompt is context, then it joins its own child.
    assert second.completion_ids == ["child", "grand"]
    assert second.input_ids == grand["prompt_ids"] + grand["output_ids"]
    assert second.loss_mask == [0] * 6 + [1] + [0] + [1, 1]
    assert second.returns == pytest.approx(0.0 + G * 1.0)
    assert second.meta["concat_fallbacks"] == 1 and second.meta["parent_id"] == "root"
    assert second.meta["turns"] == 2
    assert second.temperature == (0.7 if why == "other_temperature" else 1.0)
    assert sum(s.meta["concat_fallbacks"] for s in samples) == 1


def test_aborted_parent_makes_its_child_a_counted_fallback() -> None:
    root = _c("root", None, [1, 2, 3], [10, 11], None, 0.0, finish="abort")
    child = _c("child", "root", [1, 2, 3, 10, 11, 20], [12], 1.0, 1.0)
    [sample] = export_session("s", [root, child], "concat", G)
    assert sample.completion_ids == ["child"]
    assert sample.loss_mask == [0] * 6 + [1]
    assert sample.meta["concat_fallbacks"] == 1


def test_empty_output_turn_is_joined_through_and_empty_samples_are_dropped() -> None:
    root = _c("root", None, [1, 2], [10], None, 0.0)
    empty = _c("empty", "root", [1, 2, 10, 20], [], None, 1.0)
    last = _c("last", "empty", [1, 2, 10, 20, 21], [11], 1.0, 2.0)
    lonely = _c("lonely", None, [5, 6], [], 0.0, 3.0)  # nothing to train on
    [sample] = concat_samples("s", [root, empty, last, lonely], 1.0)
    assert sample.completion_ids == ["root", "empty", "last"]
    assert sample.loss_mask == [0, 0, 1, 0, 0, 1]
    assert sample.meta["turns"] == 3


def test_session_without_any_reward_is_refused() -> None:
    with pytest.raises(NoRewardError):
        concat_samples("s", [_c("x", None, [1], [2], None, 0.0)], 1.0)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tool_turn_masks_the_tool_result_and_trains_both_answers(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer)
    eos = int(tokenizer.eos_token_id)
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt1 = renderer.render(question, [WEATHER]).ids
    output1 = tokenizer.encode(CALL, add_special_tokens=False) + [eos]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    history = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
    ]
    prompt2 = renderer.render(history, [WEATHER]).ids
    output2 = tokenizer.encode("It is 22 degrees in Paris.", add_special_tokens=False) + [eos]
    turns = [
        _c("t2", "t1", prompt2, output2, 1.0, 1.0, version=2),
        _c("t1", None, prompt1, output1, None, 0.0, version=1),
    ]

    [s] = concat_samples("s", turns, G)
    assert s.completion_ids == ["t1", "t2"]
    assert s.input_ids == prompt2 + output2
    n1, n2 = len(prompt1), len(prompt2)
    assert s.loss_mask == [0] * n1 + [1] * len(output1) + [0] * (n2 - n1 - len(output1)) + [
        1
    ] * len(output2)
    # What sits between the two answers is the tool's result and the template: context.
    between = tokenizer.decode(s.input_ids[n1 + len(output1) : n2])
    assert between == "\n<|im_start|>tool\n22 C, sunny<|im_end|>\n<|im_start|>assistant\n"
    trained = [t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained) == CALL + "<|im_end|>It is 22 degrees in Paris.<|im_end|>"
    assert {v for v, m in zip(s.versions, s.loss_mask, strict=True) if m} == {1, 2}
    assert s.returns == pytest.approx(G * 1.0)
    assert s.meta["concat_fallbacks"] == 0 and s.meta["turns"] == 2


def test_export_endpoint_concat_style(fake_gateway, new_session, http) -> None:
    gw = fake_gateway
    session_id, key = new_session(gw)
    url = f"{gw.url}/chat/completions"
    messages = [{"role": "user", "content": "What is 2+2?"}]
    first = http.post(url, headers=bearer(key), json={"messages": messages})
    assert first.status_code == 200
    messages += [
        {"role": "assistant", "content": FAKE_REPLY},
        {"role": "user", "content": "And 3+3?"},
    ]
    second = http.post(url, headers=bearer(key), json={"messages": messages})
    assert second.status_code == 200
    id1, id2 = first.json()["id"], second.json()["id"]
    r = http.post(f"{gw.url}/rewards", headers=bearer(key), json={"rewards": {id1: 0.5, id2: 1}})
    assert r.status_code == 200

    export = f"{gw.url}/sessions/{session_id}/export"
    r = http.get(export, headers=admin_headers(), params={"style": "concat", "turn_discount": G})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["style"] == "concat"
    [s] = body["samples"]
    recs = {c["id"]: c for c in read_session(gw, session_id)["completions"]}
    rec1, rec2 = recs[id1], recs[id2]
    assert s["completion_ids"] == [id1, id2]
    assert s["input_ids"] == rec2["prompt_ids"] + rec2["output_ids"]
    n1, n2 = len(rec1["prompt_ids"]), len(rec2["prompt_ids"])
    out1, out2 = len(rec1["output_ids"]), len(rec2["output_ids"])
    assert s["loss_mask"] == [0] * n1 + [1] * out1 + [0] * (n2 - n1 - out1) + [1] * out2
    assert [lp for lp, m in zip(s["logprobs"], s["loss_mask"], strict=True) if m] == [
        FAKE_LOGPROB
    ] * (out1 + out2)
    assert s["reward"] == 1.0
    assert s["returns"] == pytest.approx(0.5 + G * 1.0)
    assert s["meta"]["turns"] == 2 and s["meta"]["concat_fallbacks"] == 0
    assert len(s["token_returns"]) == len(s["input_ids"])

    # individual still gives one sample per turn, without per-token returns
    r = http.get(export, headers=bearer(key))
    assert [x["token_returns"] for x in r.json()["samples"]] == [None, None]

    err = assert_error_shape(http.get(export, headers=bearer(key), params={"style": "nope"}), 400)
    assert err["code"] == "invalid_export_style" and "concat" in err["message"]
