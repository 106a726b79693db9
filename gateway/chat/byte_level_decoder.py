"""Ids -> text for byte-level BPE tokenizers, from a table of each token's bytes.

Every answer is decoded twice (the reply, and its next turn's text prefix), and the Rust
decode costs 25-35 us in place for 32 ids (2 us in a loop), its tables evicted by each
request's other work (docs/benchmarks.md). A byte-level token is a byte per character
(GPT-2's map), an added token its UTF-8. A start-up probe must match the tokenizer's own
decode; tests/test_byte_level_decoder.py compares them for every tokenizer we test.
"""

from __future__ import annotations

import random
from typing import Any

from tokenizers import decoders

from gateway.chat.tokenizer import bytes_to_unicode

_CHAR_BYTE = {c: b for b, c in bytes_to_unicode().items()}


class ByteLevelDecoder:
    """`decoder(ids)`: the backend's `decode(ids, skip_special_tokens=False)`, from a table
    filled per id as ids are seen."""

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
