"""Streaming parses exactly like whole text (hypothesis property tests).

Tool-call and reasoning parsers are fed text in pieces as it is generated; whatever the
pieces, the content, reasoning, tool calls and failure count must be those of parsing
the whole answer at once. And the incremental detokenizer's text must equal a full
decode of the same tokens, with the real tokenizers of the model families.
"""

from __future__ import annotations

import json

import pytest
from family_helpers import FAMILIES, family_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.chat.detokenize import IncrementalDecoder, text_decoder
from gateway.chat.events import ContentEvent, ReasoningEvent, ToolCallEvent
from gateway.chat.families import make_reasoning_parser, make_tool_parser
from gateway.chat.output_parser import OutputParser

# (tool parser, reasoning parser, family whose answers it parses)
PARSERS = [
    ("hermes", "qwen3", "qwen3"),
    ("deepseek_v3", "deepseek_r1", "deepseek_v3"),
    ("llama3_json", None, "llama3_1"),
    ("harmony", "harmony", "gptoss"),
    ("mistral", None, "mistral_nemo"),
]
CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {}), ("f", {"x": [1, {"y": "é"}]})]


def answers(family_name: str) -> list[str]:
    """Answers of every shape this family writes: text, calls, both, broken."""
    f = FAMILIES[family_name]
    out = [
        f.answer(text="Plain answer.", reasoning="Think.\nTwice."),
        f.answer(CALLS[:1], reasoning="One call."),
        f.answer(CALLS, reasoning=""),
        f.answer(reasoning="Broken:") + f.malformed,
        f.answer(text="  \n", reasoning="r"),
        "",
    ]
    if family_name != "llama3_1":  # tagged formats: text around the calls
        out.append(f.answer(text="Let me check. " + f.write_calls([f.write_call(*CALLS[1])])))
    return out


def parse(tool: str, reasoning: str | None, pieces: list[str]) -> tuple:
    """(content, reasoning, calls, failures, event kinds) after feeding `pieces`."""
    r = make_reasoning_parser(reasoning) if reasoning else None
    parser = OutputParser(r, make_tool_parser(tool))
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentEvent))
    thought = "".join(e.text for e in events if isinstance(e, ReasoningEvent))
    calls = [
        (e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, ToolCallEvent)
    ]
    assert content == "".join(parser.tool_parser.content_parts)  # events and state agree
    return parser.content, parser.reasoning, thought or None, calls, parser.failures


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.mark.parametrize(("tool", "reasoning", "family"), PARSERS)
def test_every_single_split_point_parses_like_the_whole(tool, reasoning, family):
    for text in answers(family):
        whole = parse(tool, reasoning, [text])
        for cut in range(len(text) + 1):
            assert parse(tool, reasoning, [text[:cut], text[cut:]]) == whole, (text, cut)


@pytest.mark.parametrize(("tool", "reasoning", "family"), PARSERS)
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_pieces_parse_like_the_whole(tool, reasoning, family, data):
    f = FAMILIES[family]
    fragments = [
        f.write_call(*CALLS[0]),
        f.write_call(*CALLS[1]),
        f.malformed,
        "<think>",
        "</think>",
        "\n",
        " ",
        "{",
        "}",
        ";",
        "<tool_call>",
        "</tool_call>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<|python_tag|>",
        "<|channel|>analysis<|message|>",
        "<|channel|>final<|message|>",
        "<|end|>",
        "<|start|>assistant",
        "<|call|>",
        "[TOOL_CALLS]",
        "[",
        "]",
        " to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>",
        "text",
        "é😀",
    ]
    text = "".join(data.draw(st.lists(st.sampled_from(fragments), max_size=8)))
    cuts = data.draw(st.lists(st.integers(0, max(len(text), 1)), max_size=6))
    assert parse(tool, reasoning, split(text, cuts)) == parse(tool, reasoning, [text])


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=0, max_size=40), data=st.data())
def test_incremental_detokenizer_equals_a_full_decode(family, text, data):
    tok = family_tokenizer(family)
    ids = tok.encode(text + " 🤖 中文 <think>x</think>", add_special_tokens=False)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=8))
    decoder = IncrementalDecoder(text_decoder(tok), stop_token_ids=())
    bounds = [0, *sorted(set(cuts)), len(ids)]
    released = "".join(decoder.feed(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    released += decoder.finish()
    assert released == tok.decode(ids, skip_special_tokens=False)
