"""Ids -> text for byte-level BPE tokenizers, from a table of each token's bytes.

Every answer is decoded twice on its way: into the reply's text, and into the text
prefix its next turn must render to (gateway/chat/template.py). Through the Rust
tokenizer that costs ~2 us for 32 ids in a loop but 25-35 us in place, where each
request's other work has pushed the tokenizer's tables out of the CPU caches between
calls (docs/benchmarks.md). A byte-level tokenizer's decode is simple enough to do
from a table: each token's string is a byte per character (GPT-2's byte-to-character
map), an added token's (one that is not all such characters) is its UTF-8; the
bytes of all tokens are joined and read as UTF-8, invalid bytes replaced. Ids the
tokenizer does not know decode to nothing, as there.

Used for SmolLM2, Qwen3, DeepSeek V3 and gpt-oss (and Llama 3.1 would be, but its
tokenizer cleans up spaces after decoding, so transformers' decode stays). A start-up
probe must give the tokenizer's own text for every added token and a spread of ids,
and tests/test_byte_level_decoder.py compares it with the tokenizer's decode for every
tokenizer we ship or test, over random ids and cut UTF-8 sequences.
"""

from __future__ import annotations

import random
from typing import Any

from tokenizers import decoders

from gateway.chat.tokenizer import bytes_to_unicode

_CHAR_BYTE = {c: b for b, c in bytes_to_unicode().items()}


class ByteLevelDecoder:
    """`decoder(ids)`: the text the backend tokenizer's `decode(ids,
    skip_special_tokens=False)` gives. Its table fills per id as ids are seen (at
    most the vocabulary)."""

    def __init__(self, backend: Any) -> None:
        self._token = backend.id_to_token
        self._bytes: dict[int, bytes] = {}

    def __call__(self, ids: list[int]) -> str:
        table = self._bytes
        try:
            joined = b"".join([table[i] for i in ids])
        except KeyError:
            joined = b"".join([table[i] if i in table else self._learn(i) for i in ids])
        return joined.decode("utf-8", "replace")

    def _learn(self, token_id: int) -> bytes:
        text = self._token(token_id) if token_id >= 0 else None
        if text is None:
            raw = b""
        else:
            try:
                raw = bytes([_CHAR_BYTE[c] for c in text])
            except KeyError:  # an added token written as itself
                raw = text.encode()
        self._bytes[token_id] = raw
        return raw


def byte_level_decoder(backend: Any) -> ByteLevelDecoder | None:
    """A table decoder for `backend` (a `tokenizers.Tokenizer`), or None when its decoder
    is not byte-level or the probe finds any text that differs from its own decode."""
    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    decoder = ByteLevelDecoder(backend)
    size = backend.get_vocab_size(with_added_tokens=True)
    added = list(backend.get_added_tokens_decoder())
    rng = random.Random(0)
    probes = [[i] for i in added] + [list(range(i, min(i + 64, size))) for i in range(0, 512, 64)]
    probes += [[rng.randrange(size + 8) for _ in range(24)] for _ in range(64)]
    for ids in probes:
        if decoder(ids) != backend.decode(ids, skip_special_tokens=False):
            return None
    return decoder
