"""Qwen3-Coder's XML tool calls (gateway/chat/families/qwen3_coder.py): unit tests, and
hypothesis property tests in the style of tests/test_parser_properties.py.

No Qwen3-Coder tokenizer with its template ships in npm, so these test the parser on
the text the model writes; detection is tested on a template line that teaches it.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.chat.events import ContentEvent, ReasoningEvent, ToolCallEvent
from gateway.chat.families import (
    detect_reasoning_parser,
    detect_tool_parser,
    family_of,
    make_reasoning_parser,
    make_tool_parser,
)
from gateway.chat.output_parser import OutputParser


def call(name: str, args: dict[str, Any]) -> str:
    """A call as Qwen3-Coder writes it: each value JSON, or text when it is a string."""
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<function={name}>\n{params}</function>\n"


def block(*calls: str) -> str:
    return "<tool_call>\n" + "".join(calls) + "</tool_call>"


def parse(pieces: list[str], reasoning: str | None = None) -> tuple:
    """(content, reasoning, calls, failures) after feeding `pieces`, checked against the
    events the parser gave out."""
    r = make_reasoning_parser(reasoning) if reasoning else None
    parser = OutputParser(r, make_tool_parser("qwen3_coder"))
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    calls = [
        (e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, ToolCallEvent)
    ]
    assert calls == [(c.name, json.loads(c.arguments)) for c in parser.tool_calls]
    content = "".join(e.text for e in events if isinstance(e, ContentEvent))
    assert content == "".join(parser.tool_parser.content_parts)
    thought = "".join(e.text for e in events if isinstance(e, ReasoningEvent)) or None
    assert thought == parser.reasoning
    return parser.content, parser.reasoning, calls, parser.failures


# ---- unit tests ------------------------------------------------------------------------
def test_detected_from_the_template_before_hermes() -> None:
    template = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}</think>"
    assert detect_tool_parser(template, "hermes") == "qwen3_coder"
    assert detect_reasoning_parser(template) == "qwen3"
    assert family_of(template).name == "qwen3_coder"
    assert detect_tool_parser("<tool_call>{{ tool_call | tojson }}", "hermes") == "hermes"


def test_one_call_with_typed_values() -> None:
    text = block(
        "<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n"
        "<parameter=metric>\ntrue\n</parameter>\n"
        '<parameter=opts>\n{"hourly": [1, 2]}\n</parameter>\n'
        "</function>\n"
    )
    assert parse([text]) == (
        None,
        None,
        [("get_weather", {"city": "Paris", "days": 3, "metric": True, "opts": {"hourly": [1, 2]}})],
        0,
    )


def test_a_value_keeps_its_inner_newlines_and_spaces() -> None:
    code = "def f():\n    return 1\n"
    text = block(f"<function=write>\n<parameter=code>\n{code}\n</parameter>\n</function>\n")
    [(_, args)] = parse([text])[2]
    assert args == {"code": code}


def test_no_parameters_is_a_call_with_empty_arguments() -> None:
    assert parse([block("<function=get_time>\n</function>\n")])[2] == [("get_time", {})]


def test_text_around_and_parallel_calls() -> None:
    text = (
        "Let me check.\n\n"
        + block(call("get_weather", {"city": "Paris"}))
        + "\n"
        + block(call("get_weather", {"city": "Rome"}), call("get_time", {}))
    )
    content, _, calls, failures = parse([text])
    assert content == "Let me check."
    assert calls == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
        ("get_time", {}),
    ]
    assert failures == 0


def test_with_qwen3_reasoning_first() -> None:
    text = "<think>\nNeed weather.\n</think>\n\n" + block(call("get_weather", {"city": "Oslo"}))
    assert parse([text], "qwen3") == (None, "Need weather.", [("get_weather", {"city": "Oslo"})], 0)


def test_malformed_blocks_come_back_as_text_and_are_counted() -> None:
    for body in (
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",  # no </function>
        "<function=get_weather>\nParis\n</function>\n",  # text that is not a parameter
        "just text",  # no function at all
        call("a", {}) + "stray",  # text between functions
    ):
        text = block(body)
        content, _, calls, failures = parse([text])
        assert (content, calls, failures) == (text, [], 1), body


def test_a_cut_off_block_is_a_failure_not_a_call() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    assert parse([text]) == (text, None, [], 1)


def test_plain_text_and_a_partial_tag_stream_as_content() -> None:
    assert parse(["Hello <tool", "_cal", "l is a tag"])[0] == "Hello <tool_call is a tag"


# ---- property tests --------------------------------------------------------------------
NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True)


def _not_json(text: str) -> bool:
    try:
        json.loads(text.removeprefix("\n").removesuffix("\n"))
    except ValueError:
        return True
    return False


TEXT_VALUE = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20
).filter(lambda t: "<" not in t and _not_json(t))
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
ARGS = st.dictionaries(
    NAME, TEXT_VALUE | JSON_VALUE.filter(lambda v: not isinstance(v, str)), max_size=4
)
CALLS = st.lists(st.tuples(NAME, ARGS), min_size=1, max_size=3)


def split(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted({min(c, len(text)) for c in cuts}), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=150, deadline=None)
@given(calls=CALLS, parallel=st.booleans(), before=st.sampled_from(["", "Sure. ", "a <b> c\n"]))
def test_what_the_model_wrote_is_what_is_parsed(calls, parallel, before) -> None:
    """Any calls, written as the model writes them, one block or one block each, come
    back with the same names and arguments, and the text before them as content."""
    written = [call(n, a) for n, a in calls]
    text = before + ("\n".join(block(c) for c in written) if parallel else block(*written))
    content, _, parsed, failures = parse([text])
    assert parsed == [(n, a) for n, a in calls] and failures == 0
    assert content == (before.strip() or None)


@settings(max_examples=100, deadline=None)
@given(calls=CALLS, data=st.data())
def test_any_pieces_parse_like_the_whole(calls, data) -> None:
    fragments = [
        block(call(*calls[0])),
        call(*calls[-1]),
        "<tool_call>",
        "</tool_call>",
        "<function=f>",
        "</function>",
        "<parameter=x>",
        "</parameter>",
        "<think>",
        "</think>",
        "\n",
        " ",
        "text",
        "é😀",
    ]
    text = "".join(data.draw(st.lists(st.sampled_from(fragments), max_size=8)))
    cuts = data.draw(st.lists(st.integers(0, max(len(text), 1)), max_size=6))
    for reasoning in (None, "qwen3"):
        assert parse(split(text, cuts), reasoning) == parse([text], reasoning)


def test_every_single_split_point_parses_like_the_whole() -> None:
    text = "Let me see. " + block(call("get_weather", {"city": "Paris", "days": 2})) + " ok"
    whole = parse([text])
    assert whole[2] == [("get_weather", {"city": "Paris", "days": 2})]
    for cut in range(len(text) + 1):
        assert parse([text[:cut], text[cut:]]) == whole, cut
