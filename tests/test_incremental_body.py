"""A body parsed on its session's previous one is the request the whole body parses to,
with the same hash (issue 9).

A difference would be a wrong recorded request, a wrong prompt or a retry answered from
the wrong row, so every body of random sessions is also parsed whole and compared:
sessions that append, retry, branch from an older body, rewrite an earlier message or
change a setting; bodies written with every separator style, key order and escaping the
JSON writers of agent SDKs use; message text full of what a byte-level shortcut could
trip on (`]`, `,`, quotes, backslashes, the key's own name). Hand-written bodies try the
shapes the proof must refuse: a later duplicate history key, a nested one, values spliced
into a nested array, elements that close the history early.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from fastapi.exceptions import RequestValidationError
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gateway.entrypoints.anthropic.messages.protocol import MessagesRequest
from gateway.entrypoints.incremental_body import IncrementalBodies, common_prefix
from gateway.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from gateway.entrypoints.openai.route import invalid_body
from gateway.serving.turn import request_hash

_TEXT = st.lists(
    st.sampled_from(
        ["a", "b", " ", "]", "[", ",", '"', "\\", "\n", "{", "}", ":", "é", "😀",
         '"messages"', '"messages": [', "], ", "1.0", "null", "\u2028"]
    ),
    max_size=12,
).map("".join)  # fmt: skip

_CALL = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["call_1", "call_2"]),
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.just("f"), "arguments": _TEXT}),
    }
)
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": _TEXT}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.one_of(_TEXT, st.none())},
        optional={"tool_calls": st.lists(_CALL, min_size=1, max_size=2)},
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": _TEXT, "tool_call_id": st.just("call_1")}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=2
            ),
        }
    ),  # fmt: skip
)

# how SDKs write JSON: Python's json (", " and ": "), httpx and JS (compact), pretty
_STYLES = [
    lambda body: json.dumps(body).encode(),
    lambda body: json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
    lambda body: orjson.dumps(body),
    lambda body: json.dumps(body, indent=2).encode(),
]
_ACTIONS = st.sampled_from(["append", "append", "append", "retry", "branch", "edit", "setting"])


def _body(messages: list[Any], temperature: float, order: int, tools: bool) -> dict[str, Any]:
    fields: list[tuple[str, Any]] = [("model", "m"), ("temperature", temperature)]
    if tools:
        fields.append(("tools", [{"type": "function", "function": {"name": "f"}}]))
    fields.insert(order % (len(fields) + 1), ("messages", messages))
    return dict(fields)


def _same(a: BaseModel, b: BaseModel) -> bool:
    """The same request: values and their JSON types, key order, fields set, extras."""
    return (
        orjson.dumps(a.model_dump()) == orjson.dumps(b.model_dump())
        and a.model_fields_set == b.model_fields_set
        and orjson.dumps(a.model_extra) == orjson.dumps(b.model_extra)
    )


def _check(bodies: IncrementalBodies, model: type[BaseModel], raw: bytes, session: str) -> Any:
    """Parse `raw` both ways: the same request and hash, or the same error."""
    try:
        whole = model.model_validate_json(raw)
    except ValidationError as exc:
        with pytest.raises(ValidationError) as caught:
            bodies.parse(model, raw, session, "messages")
        assert caught.value.errors(include_context=False) == exc.errors(include_context=False)
        return None
    request, digest = bodies.parse(model, raw, session, "messages")
    assert _same(request, whole), raw
    assert digest == request_hash(raw)
    return request


@settings(max_examples=150, deadline=None)
@given(
    first=st.lists(_MESSAGE, min_size=1, max_size=3),
    steps=st.lists(st.tuples(_ACTIONS, st.lists(_MESSAGE, min_size=1, max_size=3)), max_size=8),
    style=st.integers(0, len(_STYLES) - 1),
    order=st.integers(0, 3),
    tools=st.booleans(),
)
def test_every_body_parses_as_the_whole_body_would(
    first: list[Any], steps: list[tuple[str, list[Any]]], style: int, order: int, tools: bool
) -> None:
    bodies = IncrementalBodies(16, 2**24, min_bytes=0)
    dump, temperature = _STYLES[style], 0.5
    history, sent = list(first), []
    raw = dump(_body(history, temperature, order, tools))
    _check(bodies, ChatCompletionRequest, raw, "s")
    sent.append(list(history))
    for action, more in steps:
        if action == "retry":
            pass
        elif action == "branch":
            history = sent[len(sent) // 2] + more
        elif action == "edit":
            history = [{"role": "user", "content": "rewritten"}, *history[1:], *more]
        elif action == "setting":
            temperature = 1 if temperature == 0.5 else 0.5  # and 1, not 1.0
            history = history + more
        else:
            history = history + more
        raw = dump(_body(history, temperature, order, tools))
        _check(bodies, ChatCompletionRequest, raw, "s")
        sent.append(list(history))


def _session(bodies: IncrementalBodies, *raws: bytes, model: type[BaseModel] = ChatCompletionRequest) -> list[Any]:  # fmt: skip
    return [_check(bodies, model, raw, "s") for raw in raws]


def _msg(text: str, role: str = "user") -> str:
    return json.dumps({"role": role, "content": text})


def test_an_appending_session_is_parsed_only_where_new_and_holds_its_parents_messages() -> None:
    history = [_msg("system prompt", "system"), _msg("q0")]
    raws = []
    for turn in range(6):
        raws.append(
            f'{{"model": "m", "messages": [{", ".join(history)}], "logprobs": true}}'.encode()
        )
        history += [_msg(f"answer {turn} ]", "assistant"), _msg(f"tool output {turn}, [x]")]
    bodies = IncrementalBodies(16, 2**24, min_bytes=0)
    requests = _session(bodies, *raws)
    assert (bodies.whole, bodies.reused) == (1, 5)
    for parent, child in zip(requests, requests[1:], strict=False):
        # the child's history starts with its parent's very message objects
        assert all(a is b for a, b in zip(parent.messages, child.messages, strict=False))


@pytest.mark.parametrize(
    "raws",
    [
        # a later duplicate key wins the parse: the first array is not the history
        (b'{"messages": [{"role": "user", "content": "a"}], "messages": [{"role": "user", "content": "b"}]}',
         b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "c"}], "messages": [{"role": "user", "content": "b"}]}'),
        # a nested key of the same name comes first
        (b'{"metadata": {"messages": [1]}, "messages": [{"role": "user", "content": "a"}]}',
         b'{"metadata": {"messages": [1, 2]}, "messages": [{"role": "user", "content": "a"}]}'),
        # values spliced into the last message's own array, not the history
        (b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}]}',
         b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1"}, {"id": "2"}]}]}'),
        # new "elements" that close the history early and open another array, which the
        # next body then extends
        (b'{"messages": [{"role": "user", "content": "a"}], "x": [1]}',
         b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "y": [2], "x": [1]}',
         b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "y": [2, {"role": "user", "content": "c"}], "x": [1]}'),
        # a string whose text holds `]`: the first difference is inside it
        (b'{"messages": [{"role": "user", "content": "a]b"}]}',
         b'{"messages": [{"role": "user", "content": "a,{\\"role\\": \\"user\\"}]b"}]}'),
        # the new part is not JSON, or not a whole value
        (b'{"messages": [{"role": "user", "content": "a"}]}',
         b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"]}'),
        (b'{"messages": [{"role": "user", "content": "a"}]}',
         b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, ]}'),
        # a new message the model refuses: the error names its place in the whole history
        (b'{"messages": [{"role": "user", "content": "a"}]}',
         b'{"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}'),
        (b'{"messages": [{"role": "user", "content": "a"}]}',
         b'{"messages": [{"role": "user", "content": "a"}, 7]}'),
    ],
)  # fmt: skip
def test_shapes_the_proof_refuses_are_parsed_whole(raws: tuple[bytes, ...]) -> None:
    bodies = IncrementalBodies(16, 2**24, min_bytes=0)
    _session(bodies, *raws)
    _session(bodies, raws[-1] + b" ")  # and nothing kept from them misleads a later body


def test_an_invalid_new_message_is_reported_as_the_whole_parse_reports_it() -> None:
    bodies = IncrementalBodies(16, 2**24, min_bytes=0)
    first = b'{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}'
    bad = first[:-2] + b', {"role": "robot", "content": "c"}]}'
    _session(bodies, first, first[:-2] + b', {"role": "user", "content": "c"}]}')
    with pytest.raises(ValidationError) as caught:
        bodies.parse(ChatCompletionRequest, bad, "s", "messages")
    (error,) = invalid_body(caught.value).errors()
    assert error["loc"] == ("body", "messages")
    assert "messages[2].role" in error["msg"]  # its index in the whole history
    assert isinstance(invalid_body(caught.value), RequestValidationError)


def test_anthropic_bodies_too() -> None:
    blocks = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    raws = []
    for turn in range(4):
        raws.append(
            json.dumps({"model": "m", "max_tokens": 64, "system": "s", "messages": blocks}).encode()
        )
        blocks = [*blocks, {"role": "assistant", "content": [{"type": "text", "text": f"a{turn}"}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "]"}]}]  # fmt: skip
    bodies = IncrementalBodies(16, 2**24, min_bytes=0)
    _session(bodies, *raws, model=MessagesRequest)
    assert bodies.reused == 3


def test_sessions_are_kept_apart_and_bounded() -> None:
    bodies = IncrementalBodies(2, 2**24, min_bytes=0)
    a = b'{"messages": [{"role": "user", "content": "a"}]}'
    a2 = a[:-2] + b', {"role": "user", "content": "a2"}]}'
    bodies.parse(ChatCompletionRequest, a, "s1", "messages")
    _check(bodies, ChatCompletionRequest, a2, "s2")  # another session's body is not used
    assert bodies.reused == 0
    b = b'{"max_tokens": 5, "messages": [{"role": "user", "content": "a"}]}'
    bodies.parse(ChatCompletionRequest, b, "s6", "messages")
    b2 = b[:-2] + b', {"role": "user", "content": "b2"}]}'
    assert _check(bodies, MessagesRequest, b2, "s6") is not None  # nor another endpoint's
    assert bodies.reused == 0
    for s in ("s3", "s4", "s5"):
        bodies.parse(ChatCompletionRequest, a, s, "messages")
    assert len(bodies._priors._data) == 2  # noqa: SLF001 (the LRU's bound, by sessions)
    small = IncrementalBodies(16, len(a) * 3 // 2, min_bytes=0)  # room for one body
    small.parse(ChatCompletionRequest, a, "s1", "messages")
    small.parse(ChatCompletionRequest, a, "s2", "messages")
    assert small._priors.weight <= len(a) * 3 // 2  # noqa: SLF001 (and by bytes)


def test_small_bodies_are_parsed_whole_and_keep_nothing() -> None:
    bodies = IncrementalBodies(16, 2**24, min_bytes=200)
    small = b'{"messages": [{"role": "user", "content": "a"}]}'
    large = small[:-2] + b", " + b", ".join([b'{"role": "user", "content": "b"}'] * 8) + b"]}"
    _session(bodies, small, small[:-2] + b', {"role": "user", "content": "b"}]}')
    assert bodies._priors.get(("s", ChatCompletionRequest)) is None  # noqa: SLF001
    _session(bodies, large, large[:-2] + b', {"role": "user", "content": "c"}]}')
    assert (bodies.whole, bodies.reused) == (1, 1)


@given(st.binary(max_size=40), st.binary(max_size=40))
def test_common_prefix(a: bytes, b: bytes) -> None:
    n = common_prefix(a, b)
    assert a[:n] == b[:n] and (n == min(len(a), len(b)) or a[n] != b[n])


def test_a_kept_history_cannot_be_changed_by_whoever_handles_the_request() -> None:
    """The next body is built on this one's message objects, so a handler that changes
    its request's history in place (a message, a nested list, the list itself) is
    refused; one that gives its request a new list changes nothing kept. The next body
    still parses as the whole body would, on the kept messages."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    first_raw = json.dumps({"model": "m", "messages": history}).encode()
    second_raw = json.dumps(
        {
            "model": "m",
            "messages": [*history, {"role": "tool", "content": "r", "tool_call_id": "c1"}],
        }
    ).encode()
    for min_bytes in (0, 10**6):  # kept and parsed on, or parsed whole: frozen alike
        bodies = IncrementalBodies(16, 2**24, min_bytes=min_bytes)
        first = _check(bodies, ChatCompletionRequest, first_raw, "s")
        for change in (
            lambda h: h.append({"role": "user", "content": "more"}),
            lambda h: h.pop(),
            lambda h: h[0].__setitem__("role", "system"),
            lambda h: h[0]["content"][0].update(text="changed"),
            lambda h: h[1]["tool_calls"][0]["function"].pop("name"),
            lambda h: h[1]["tool_calls"].clear(),
        ):
            with pytest.raises(TypeError):
                change(first.messages)
        first.messages = [{"role": "user", "content": "replaced"}]  # its own list now
        second = _check(bodies, ChatCompletionRequest, second_raw, "s")
        assert second.messages[:2] == history
        assert bodies.reused == (1 if min_bytes == 0 else 0)
