"""A model family is one file in gateway/chat/families/ (issue 32, item 3).

Each module there registers one family by its own name; the parsers a family names are
registered; detection on the families' real templates picks one family each, with no
two specific families claiming the same template. A family defined outside the package
is detected and rendered like a built-in one. Mistral's `[TOOL_CALLS]` family, added as
one file, has its template quirk (9-character call ids) checked on its real template.
"""

from __future__ import annotations

import json
import pkgutil
import re

import pytest
from family_helpers import FAMILIES as TEST_FAMILIES
from family_helpers import family_tokenizer

from gateway.chat import families
from gateway.chat.events import ContentEvent, ToolCallEvent
from gateway.chat.families.mistral import MistralToolParser, template_id
from gateway.chat.parsers import REASONING_PARSERS, TOOL_PARSERS, BlockToolParser
from gateway.chat.template import ChatRenderer

# test family -> (family detected, tool parser, reasoning parser)
DETECTED = {
    "qwen3": ("qwen3", "hermes", "qwen3"),
    "deepseek_v3": ("deepseek", "deepseek_v3", None),
    "llama3_1": ("llama3", "llama3_json", None),
    "gptoss": ("gpt_oss", "harmony", "harmony"),
    "mistral_nemo": ("mistral", "mistral", None),
}


def test_every_module_is_one_registered_family() -> None:
    modules = {m.name for m in pkgutil.iter_modules(families.__path__)}
    assert modules == set(families.FAMILIES)


def test_the_parsers_a_family_names_are_registered() -> None:
    for family in families.FAMILIES.values():
        if family.tool_parser:
            assert family.tool_parser in TOOL_PARSERS, family.name
        if family.reasoning_parser:
            assert family.reasoning_parser in REASONING_PARSERS, family.name


def test_stop_tokens_are_the_families_turn_enders() -> None:
    assert families.stop_tokens() == {
        "<|im_end|>",
        "<|endoftext|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|call|>",
    }


@pytest.mark.parametrize("name", sorted(DETECTED))
def test_each_real_template_is_one_familys(name: str) -> None:
    assert set(DETECTED) == set(TEST_FAMILIES)  # a new test family says what it detects
    renderer = ChatRenderer(family_tokenizer(name), TEST_FAMILIES[name].chat_template)
    family, tools, reasoning = DETECTED[name]
    assert renderer.family is not None and renderer.family.name == family
    assert (renderer.tool_parser, renderer.reasoning_parser) == (tools, reasoning)
    template = renderer.chat_template
    claims = [
        f.name
        for f in families.FAMILIES.values()
        if not f.generic and f.teaches_tools is not None and f.teaches_tools(template)
    ]
    assert len(claims) <= 1, claims  # no two specific families claim one template


class _AngleParser(BlockToolParser):
    open, close = "<<", ">>"

    def parse_block(self, body: str) -> list[tuple[str, str]] | None:
        name, _, args = body.partition(" ")
        return [(name, json.dumps(json.loads(args or "{}")))]


ANGLE_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for tc in m.tool_calls or [] %}<<{{ tc.function.name }} {{ tc.function.arguments"
    " | tojson }}>>{% endfor %}</{{ m.role }}>{% endfor %}"
    "{% if tools %}TOOLS{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_family_from_outside_is_one_registration(tokenizer) -> None:
    """What a new family file does, from here: its parser, its detection, its quirk."""
    TOOL_PARSERS.register("angle")(_AngleParser)

    def shout(message: dict) -> dict:
        return {**message, "content": (message["content"] or "").upper()}

    families.register_family(
        families.Family(
            "angle",
            tool_parser="angle",
            teaches_tools=lambda t: "<<{{ tc.function.name }}" in t,
            shape_message=shout,
        )
    )
    try:
        renderer = ChatRenderer(tokenizer, ANGLE_TEMPLATE)
        assert renderer.family.name == "angle" and renderer.tool_parser == "angle"
        text = renderer.render_text([{"role": "user", "content": "hi"}], tools=[{"x": 1}])
        assert text == "<user>HI</user>TOOLS<assistant>"
        parser = families.make_tool_parser(renderer.tool_parser)
        events = parser.feed('Sure <<get_time {"tz": "UTC"}>>') + parser.finish()
        assert [type(e) for e in events] == [ContentEvent, ToolCallEvent]
    finally:
        families.FAMILIES.pop("angle")
        TOOL_PARSERS.pop("angle")


# ---- Mistral ---------------------------------------------------------------------------
def _parse(text: str, pieces: int = 1) -> MistralToolParser:
    parser = MistralToolParser()
    step = max(1, len(text) // pieces)
    for i in range(0, len(text), step):
        parser.feed(text[i : i + step])
    parser.finish()
    return parser


def test_mistral_calls_content_and_ids() -> None:
    text = (
        'Checking. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {}}]'
    )
    for pieces in (1, 3, len(text)):
        parser = _parse(text, pieces)
        assert [(c.name, json.loads(c.arguments)) for c in parser.tool_calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_time", {}),
        ]
        assert parser.content == "Checking."
        assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in parser.tool_calls)


def test_mistral_token_before_each_call_and_a_broken_list() -> None:
    two = '[TOOL_CALLS][{"name": "a", "arguments": {}}][TOOL_CALLS]{"name": "b", "arguments": {}}'
    assert [c.name for c in _parse(two).tool_calls] == ["a", "b"]
    broken = _parse('[TOOL_CALLS][{"name": "a", "arguments": {"x": }}]')
    assert broken.tool_calls == [] and broken.failures == 1
    assert broken.content == '[TOOL_CALLS][{"name": "a", "arguments": {"x": }}]'


def test_mistral_ids_the_template_accepts() -> None:
    assert template_id("abcDEF123") == "abcDEF123"
    other = template_id("call_0123456789abcdef01234567")
    assert re.fullmatch(r"[0-9a-f]{9}", other) and other == template_id(
        "call_0123456789abcdef01234567"
    )
    assert template_id("toolu_01") != template_id("toolu_02")
    assert template_id(None) is None


def test_mistral_template_renders_any_client_call_id() -> None:
    """The published template raises on ids that are not 9 letters or digits; an OpenAI
    or Anthropic id renders as its hash, the same in the call and in its result."""
    renderer = ChatRenderer(family_tokenizer("mistral_nemo"))
    call = {
        "id": "toolu_01A09q90qw90lq917835lq9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "22 C"},
    ]
    text = renderer.render_text(messages)
    short = template_id(call["id"])
    assert f'"id": "{short}"' in text and f'"call_id": "{short}"' in text
    assert call["id"] not in text
    assert messages[1]["tool_calls"][0]["id"] == call["id"]  # the caller's messages unchanged
