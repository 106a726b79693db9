"""Incremental prompts: a turn that extends its parent is encoded from the parent's ids.

Random multi-turn sessions (hypothesis) with the real SmolLM2 tokenizer and chat
template: whenever the renderer builds a prompt on its parent's ids, they are exactly
the ids a full encode of the whole render gives, and it never falls back on a session
whose client sends the answers back as they were given.
"""

from __future__ import annotations

import orjson
import pytest
from gateway_helpers import completion_record, http_client, openai_client
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway import json_codec
from gateway.chat.template import ChatRenderer
from gateway.frozen import FrozenList, freeze
from gateway.token_ids import TokenIds, json_object_with_ids

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=60
)
TURN = st.tuples(TEXT, TEXT)  # (assistant answer, next user message)


def _session(
    renderer: ChatRenderer, system: str | None, first: str, turns: list
) -> tuple[int, int]:
    """Run one session; returns (incremental renders, fallbacks)."""
    tok = renderer.tokenizer
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": first}
    ]
    parent = None
    incremental = fallbacks = 0
    for answer, user in turns:
        rendered = renderer.render(messages, parent=parent)
        text = renderer.render_text(messages)  # the whole render, on its own
        full = tok.encode(text, add_special_tokens=False)
        assert "".join(rendered.parts) == text
        if rendered.incremental:
            incremental += 1
            assert rendered.ids == full
            # SmolLM2's template is message-local: only the new messages were rendered
            assert len(rendered.parts) > 1 and text.endswith(rendered.text)
        elif parent is not None:
            fallbacks += 1
        # The model's answer, tokenised as it would be in context, ending in <|im_end|>.
        in_context = tok.encode(text + answer + "<|im_end|>", add_special_tokens=False)
        assume(in_context[: len(full)] == full)
        output = in_context[len(full) :]
        # the client sends back the text the model's tokens decode to (a tokenizer that
        # drops control characters could not have produced them)
        assume(tok.decode(output, skip_special_tokens=False) == answer + "<|im_end|>")
        prefix = renderer.text_prefix(rendered, output)
        assert prefix is not None  # it ends in the stop token
        parent = (full, output, prefix)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": user}]
    return incremental, fallbacks


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples every run: CI cannot flake on a lucky draw
    # answers that no model could have produced (they re-tokenise differently) are assumed away
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(system=st.none() | TEXT, first=TEXT, turns=st.lists(TURN, min_size=2, max_size=6))
def test_incremental_ids_equal_a_full_encode(tokenizer, system, first, turns) -> None:
    renderer = ChatRenderer(tokenizer)
    incremental, fallbacks = _session(renderer, system, first, turns)
    assert fallbacks == 0
    assert incremental == len(turns) - 1


def test_a_changed_history_falls_back_to_a_full_encode(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer)
    first = [{"role": "user", "content": "What is 2 + 2?"}]
    r1 = renderer.render(first)
    output = tokenizer.encode("4<|im_end|>", add_special_tokens=False)
    parent = (r1.ids, output, renderer.text_prefix(r1, output))
    edited = [  # the client sends the answer back changed: the parent's text is not a prefix
        *first,
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    r2 = renderer.render(edited, parent=parent)
    assert not r2.incremental
    assert r2.ids == tokenizer.encode(r2.text, add_special_tokens=False)
    # an answer cut off by the length limit (no stop token): no child continues it
    assert renderer.text_prefix(r1, output[:-1]) is None


def test_the_gateway_builds_later_turns_on_their_parent(fake_gateway, new_session, tokenizer):
    """Over HTTP: each later turn is built on its parent's ids, counted in /metrics, and
    its recorded prompt is what a full encode of the chat template gives."""
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    ids = []
    for turn in range(4):
        reply = client.chat.completions.create(model="default", messages=messages)
        ids.append(reply.id)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"Tell me more, part {turn}."},
        ]
    renderer = ChatRenderer(tokenizer)
    for n, cid in enumerate(ids):
        rec = completion_record(fake_gateway, session_id, cid)
        text = renderer.render_text(rec["request"]["messages"])
        assert rec["prompt_ids"] == tokenizer.encode(text, add_special_tokens=False)
        assert rec["tokens_continue_parent"] is (None if n == 0 else True)
    with http_client() as http:
        metrics = http.get(f"{fake_gateway.url.removesuffix('/v1')}/metrics").text
    assert "turnstile_prompts_incremental_total 3" in metrics
    assert "turnstile_prompts_fallbacks_total" not in metrics


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(0, 2**31), max_size=40), min_size=1, max_size=6))
def test_prompt_ids_sent_on_their_parents_json_are_the_same_json(parts) -> None:
    """Each turn's ids go to the engine as the parent's JSON + the new ids' JSON: the
    same bytes as writing the whole list, whatever the parts (empty ones too)."""
    ids, expected = TokenIds(parts[0]), list(parts[0])
    assert b"".join(json_object_with_ids("x", ids, b"{}")) == orjson.dumps({"x": expected})
    for part in parts[1:]:
        ids = TokenIds.joined(ids, part, [7])
        expected += [*part, 7]
        assert ids == expected
        assert b"".join(json_object_with_ids("x", ids, b"{}")) == orjson.dumps({"x": expected})
        body = b"".join(json_object_with_ids("input_ids", ids, orjson.dumps({"stream": False})))
        assert body == orjson.dumps({"input_ids": expected, "stream": False})
        # and read as a list would be, without flattening for a tail
        assert list(ids) == expected and len(ids) == len(expected)
        assert ids[len(ids) - len(part) - 1 :] == expected[len(expected) - len(part) - 1 :]
        assert ids[-1] == 7 and ids[1:3] == expected[1:3] and expected == ids
    assert json_codec.dumps({"ids": ids}) == orjson.dumps({"ids": expected})


def test_interned_ids_keep_their_values_and_odd_ones_stay(tokenizer) -> None:
    """Cached ids share one int object per id; an engine whose vocabulary is padded past
    the tokenizer's (or a broken one) keeps its ids as they were, never remapped."""
    renderer = ChatRenderer(tokenizer)
    ids = renderer.encode("Hello there, 12345 tokens!")
    assert ids == tokenizer.encode("Hello there, 12345 tokens!", add_special_tokens=False)
    odd = [1, len(tokenizer) + 7, -1, 500]
    assert renderer.interned(odd) == odd
    assert renderer.interned(ids)[0] is renderer.interned(list(ids))[0]


def test_normalised_messages_are_kept_per_history_and_bounded() -> None:
    """A history repeated by the next body (the same frozen message objects) is
    normalised once; an edited message is a new object with its own form; the memo stays
    within bound. Only a frozen history is kept, and what is kept is frozen: neither the
    caller nor the memo can change what the other relies on."""
    from gateway.chat.template import NormalizedMessages, normalize_message
    from gateway.chat.template_traits import TemplateTraits

    traits = TemplateTraits(False, True, True, True, False)
    memo = NormalizedMessages(lambda m: normalize_message(m, traits), histories=8)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    plain = [{"role": "user", "content": f"q{i}"} for i in range(3)]
    plain.append({"role": "assistant", "content": "", "tool_calls": [call]})
    assert memo(plain) == [normalize_message(m, traits) for m in plain]
    assert len(memo.memo.histories) == 0  # not frozen: its messages may change, not kept
    history = freeze(plain)  # as gateway/entrypoints/incremental_body.py hands them on
    first = memo(history)
    assert first == [normalize_message(m, traits) for m in history]
    grown = FrozenList([*history, freeze({"role": "tool", "content": "r", "tool_call_id": "c"})])
    second = memo(grown)
    assert all(a is b for a, b in zip(first, second, strict=False))  # not normalised again
    assert second[-1] == normalize_message(grown[-1], traits)
    # what a caller could change, it cannot: the messages it sent, the forms it got
    for change in (
        lambda: history[3]["tool_calls"][0]["function"].update(name="g"),
        lambda: history[0].__setitem__("content", "changed in place"),
        lambda: second[0].__setitem__("content", "changed in place"),
        lambda: second[3]["tool_calls"].append(call),
        lambda: second.append({"role": "user", "content": "appended"}),
    ):
        with pytest.raises(TypeError):
            change()
    assert memo(grown) == [normalize_message(m, traits) for m in plain + [grown[-1]]]
    edited = FrozenList([freeze({**history[0], "content": "changed"}), *history[1:]])
    assert memo(edited)[0]["content"] == "changed"
    for i in range(40):
        memo(freeze([{"role": "user", "content": str(i)}]))
        assert len(memo.memo.histories) <= 8
    assert memo(grown) == [normalize_message(m, traits) for m in grown]
    # a caller's list grown or changed in place is not mistaken for the one seen before
    longer = [*grown, freeze({"role": "user", "content": "appended"})]
    assert memo(FrozenList(longer))[-1]["content"] == "appended"
    longer[1] = freeze({"role": "user", "content": "replaced"})
    assert memo(longer) == [normalize_message(m, traits) for m in longer]
