"""ASCII text to token ids a pre-token at a time, from a cache of the tokenizer's own ids.

Encoding a turn's new text is the gateway's largest cost per request: the Rust
tokenizer's tables are evicted from the CPU caches between turns (an encode costs 2-3x
what it does in a loop), and agents' text is mostly ASCII that repeats its words. For
ASCII this does what the tokenizer does: split off added tokens, split the rest with
its own pattern, map each piece with its own BPE model, kept per piece (BPE sees one
piece at a time, so the ids are those of one encode of the whole).

Only for pipelines it states exactly on ASCII (no normaliser but NFC, one byte-level
split pattern with ASCII classes, added tokens matched as written); the rest goes to
Rust. A start-up probe must agree with the tokenizer, and tests/test_ascii_encoder.py
checks random text for every tokenizer we ship or test.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from gateway.chat.tokenizer import bytes_to_unicode

log = logging.getLogger(__name__)

# GPT-2's pattern, which a ByteLevel pre-tokenizer with `use_regex` applies
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Unicode classes as their ASCII members (the empty ones have none)
_ASCII_CLASSES = dict(L="A-Za-z", Lu="A-Z", Ll="a-z", Lt="", Lm="", Lo="", M="", N="0-9")
_PROBE = (
    "".join(map(chr, range(128)))
    + " It's they're we've I'm you'll he'd IT'S DON'T 's 't x's 12345 007 3.14 1,000,000"
    + " a  b   c\t\td\n\ne \r\n f \x0b\x0c g  \n  h\t \n i  1  2 foo(bar)==baz; x+=1 // y"
    + " HTTPServer getHTTPResponse snake_case CamelCase ALLCAPS a/b/c ./path/to ...!!! ??"
    + ' \'quoted\' "double" `tick` <tag> </tag> {"k": [1, 2]}   trailing   '
    # every character beside letters, digits, spaces and itself, where the classes meet
    + "".join(f"a{c} {c}b {c}{c}  {c}1 '{c}\n{c}" for c in map(chr, range(128)))
)

# one step of a pattern: a Unicode class, an escape, a class's opening, a character
_PIECE = re.compile(r"\\[pP]\{([^}]*)\}|\\.|\[\^?\]?|.", re.DOTALL)

# the byte-level alphabet (each byte as the character BPE merges see), for ASCII
_BYTE_LEVEL = {b: c for b, c in bytes_to_unicode().items() if b < 128}


def ascii_pattern(pattern: str) -> re.Pattern[str] | None:
    """`pattern` (the tokenizer's, Oniguruma syntax) for ASCII input in Python's `re`:
    `\\p{X}` as its ASCII members; None if it uses a class without a known equivalent."""
    out: list[str] = []
    in_class = False
    for m in _PIECE.finditer(pattern):
        piece, name = m.group(), m.group(1)
        if name is not None:  # \p{X} or \P{X}
            members = _ASCII_CLASSES.get(name)
            # (outside a class, one that matches nothing in ASCII is not worth stating)
            if members is None or piece[1] == "P" or not (in_class or members):
                return None
            out.append(members if in_class else f"[{members}]")
        elif piece[0] == "[" and in_class:  # a literal `[`; a `]` after it closes the class
            out.append("\\[" + piece[1:])
            in_class = not piece.endswith("]")
        elif piece[0] == "[":  # a class opens; a `]` first in it is literal
            out.append(piece.replace("]", "\\]"))
            in_class = True
        else:
            in_class = in_class and piece != "]"
            out.append(piece)
    try:
        # re.ASCII: `\s` is [ \t\n\r\f\v], as Oniguruma's is on ASCII (not \x1c-\x1f)
        return re.compile("".join(out), re.ASCII)
    except re.error:
        return None


def split_pattern(backend: Any) -> str | None:
    """The one regex a tokenizer (`tokenizers.Tokenizer`) splits text with before
    byte-level BPE, or None when its pipeline is not one this module states exactly."""
    normalizer = _state(backend.normalizer)
    if normalizer is not None and normalizer.get("type") != "NFC":
        if not (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")):
            return None
    model = backend.model
    if type(model).__name__ != "BPE" or model.dropout or model.byte_fallback:
        return None
    pre = _state(backend.pre_tokenizer) or {}
    if pre.get("type") == "ByteLevel":
        steps = [pre]
    elif pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
    else:
        return None
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return None
    byte_level, splits = steps[-1], steps[:-1]
    if byte_level.get("use_regex"):
        return _GPT2_PATTERN if not splits else None
    if len(splits) != 1:
        return None
    split = splits[0]
    regex = (split.get("pattern") or {}).get("Regex")
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    return regex if isinstance(regex, str) else None


def _state(component: Any) -> dict[str, Any] | None:
    """A normaliser's or pre-tokenizer's settings, as tokenizer.json writes them."""
    return None if component is None else json.loads(component.__getstate__())


class AsciiEncoder:
    """`encode(text)`: the tokenizer's ids for ASCII `text`, or None (not ASCII, or not
    covered end to end by the pattern): the caller encodes it with the tokenizer."""

    def __init__(
        self,
        pattern: re.Pattern[str],
        added: dict[str, int],
        tokenize: Callable[[str], list[int]],
        cache_size: int,
    ) -> None:
        self._pattern = pattern
        self._added = added
        # leftmost, and longest first where two start at the same place (as the
        # tokenizer's Aho-Corasick match does)
        names = sorted(added, key=len, reverse=True)
        self._splitter = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        table = str.maketrans(_BYTE_LEVEL)
        # functools' LRU (in C): a hit costs about a dict lookup
        self._words = lru_cache(cache_size)(lambda piece: tuple(tokenize(piece.translate(table))))

    def encode(self, text: str) -> list[int] | None:
        if not text.isascii():
            return None
        parts = self._splitter.split(text) if self._splitter is not None else [text]
        ids: list[int] = []
        lookup = self._words
        findall = self._pattern.findall
        for i, part in enumerate(parts):
            if i & 1:
                ids.append(self._added[part])
            elif part:
                pieces = findall(part)
                if sum(map(len, pieces)) != len(part):
                    return None  # a gap the pattern does not match: the tokenizer's way
                for piece_ids in map(lookup, pieces):
                    ids += piece_ids
        return ids

    @property
    def cached(self) -> int:
        return self._words.cache_info().currsize


def ascii_encoder(
    backend: Any,
    reference: Callable[[str], list[int]],
    intern: Callable[[list[int]], list[int]],
    cache_size: int,
) -> AsciiEncoder | None:
    """An AsciiEncoder for `backend` (a `tokenizers.Tokenizer`) when its pipeline is one
    this module states exactly and the probe agrees with `reference`; else None."""
    if cache_size <= 0 or getattr(backend, "encode_special_tokens", False):
        return None
    regex = split_pattern(backend)
    pattern = ascii_pattern(regex) if regex is not None else None
    added_tokens = backend.get_added_tokens_decoder()
    if pattern is None or any(
        t.lstrip or t.rstrip or t.single_word or t.normalized for t in added_tokens.values()
    ):
        return None
    model = backend.model
    added = {t.content: intern([i])[0] for i, t in added_tokens.items()}
    encoder = AsciiEncoder(
        pattern, added, lambda piece: intern([t.id for t in model.tokenize(piece)]), cache_size
    )
    probe = _PROBE + "".join(added) + " ".join(added) + "".join(added)[::-1]
    for text in (probe, *probe.split(" ")):
        if encoder.encode(text) != reference(text):
            log.warning("the ASCII encoder disagrees with the tokenizer on %r; not used", text)
            return None
    return encoder
