"""The ASCII encoder gives the Rust tokenizer's ids, or steps aside (issue 9).

A wrong id here would be token drift in every recorded prompt, so the property is
checked against the tokenizer itself (not against `ChatRenderer.encode`, which the
incremental-prompt tests use on both sides) for every tokenizer we ship or test, over
text made of what tokenizers split on: contractions, digit runs, whitespace runs of every
ASCII kind (including the \\x1c-\\x1f that Python counts as space and Oniguruma does
not), punctuation, added tokens written into the text, and some non-ASCII.
"""

from __future__ import annotations

import re

import pytest
from family_helpers import FAMILIES, family_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.chat.ascii_encoder import ascii_pattern
from gateway.chat.template import ChatRenderer

_FRAGMENTS = [
    *"abcxyzABCXYZ0123456789",
    *" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x00\x7f",
    *"'\".,;:!?-_/\\()[]{}<>=+*&^%$#@`~|",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL",
    "  ", "\n\n", "\r\n", " \n ", "   ", "1234", "3.14", "HTTPServer", "snake_case",
    "é", "日本", "😀", "\u00a0",
]  # fmt: skip


def _texts(specials: list[str]) -> st.SearchStrategy[str]:
    fragment = st.sampled_from(_FRAGMENTS + specials)
    return st.lists(fragment, max_size=40).map("".join)


_RENDERERS: dict[str, ChatRenderer] = {}


def _renderer(name: str, tokenizer) -> ChatRenderer:
    if name not in _RENDERERS:
        if name == "smollm2":
            _RENDERERS[name] = ChatRenderer(tokenizer)
        else:
            _RENDERERS[name] = ChatRenderer(family_tokenizer(name), FAMILIES[name].chat_template)
    return _RENDERERS[name]


def _rust(renderer: ChatRenderer, text: str) -> list[int]:
    return renderer.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "llama3_1", "gptoss", "deepseek_v3"])
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_same_ids_as_the_tokenizer(name: str, tokenizer, data) -> None:
    renderer = _renderer(name, tokenizer)
    specials = [t.content for t in renderer.tokenizer.added_tokens_decoder.values()][:30]
    text = data.draw(_texts(specials))
    assert renderer.encode(text) == _rust(renderer, text)
    if renderer._ascii is not None and text.isascii():
        # the path is really taken for ASCII, not left to the fallback
        assert renderer._ascii.encode(text) is not None


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "llama3_1", "gptoss"])
def test_taken_for_the_tokenizers_it_can_state(name: str, tokenizer) -> None:
    renderer = _renderer(name, tokenizer)
    assert renderer._ascii is not None
    block = "def main():\n    print('hello, world')  # it's 42\n\n" * 20
    assert renderer._ascii.encode(block) == _rust(renderer, block)
    assert renderer._ascii.encode("naïve") is None  # not ASCII: the tokenizer's way


def test_left_to_the_tokenizer_when_the_pipeline_has_several_splits() -> None:
    """DeepSeek V3 splits three times before byte-level BPE: not stated here."""
    renderer = _renderer("deepseek_v3", None)
    assert renderer._ascii is None
    assert renderer.encode("x = 12345 'tis") == _rust(renderer, "x = 12345 'tis")


def test_word_cache_is_bounded(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, word_cache_size=8)
    text = " ".join(f"word{i} w{i}x" for i in range(500))
    assert renderer.encode(text) == _rust(renderer, text)
    assert renderer._ascii.cached <= 8
    assert renderer.encode(text) == _rust(renderer, text)  # after the turnover


def test_word_cache_off(tokenizer) -> None:
    assert ChatRenderer(tokenizer, word_cache_size=0)._ascii is None


def test_pattern_classes_as_ascii() -> None:
    pattern = ascii_pattern(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|\s+(?!\S)")
    assert pattern is not None
    # \x1c is not whitespace to the tokenizer: it starts a word, as a non-letter
    assert pattern.findall("ab1234  \x1cz") == ["ab", "123", "4", " ", "\x1cz"]
    assert ascii_pattern(r"\p{Han}+") is None  # no ASCII statement of it
    assert ascii_pattern(r"\P{L}") is None
    assert isinstance(ascii_pattern(r"[\p{Lu}\p{Lt}]+"), re.Pattern)
