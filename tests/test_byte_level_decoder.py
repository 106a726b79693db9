"""The byte-level table decoder (gateway/chat/byte_level_decoder.py) gives the Rust
tokenizer's own text, special tokens kept, for every tokenizer we ship or test."""

from __future__ import annotations

import random

import pytest
from family_helpers import FAMILIES, family_tokenizer

from gateway.chat.byte_level_decoder import ByteLevelDecoder, byte_level_decoder
from gateway.chat.detokenize import text_decoder
from gateway.inference.model_source import load_tokenizer, resolve_model_dir

NAMES = ["smollm2", *FAMILIES]


def tokenizer(name: str):  # type: ignore[no-untyped-def]
    return load_tokenizer(resolve_model_dir(None)) if name == "smollm2" else family_tokenizer(name)


@pytest.mark.parametrize("name", NAMES)
def test_table_text_is_the_tokenizers_text(name: str) -> None:
    tok = tokenizer(name)
    backend = tok.backend_tokenizer
    decoder = byte_level_decoder(backend)
    assert decoder is not None, "every tokenizer we ship or test is byte-level"
    size = backend.get_vocab_size(with_added_tokens=True)
    added = list(tok.added_tokens_decoder)
    text = "Ça coûte 3€ — 日本語の文章, emoji 🙂🚀 and <think>\n tabs\t</think>"
    whole = tok.encode(text, add_special_tokens=False)
    rng = random.Random(7)
    cases = [whole, *(whole[:k] for k in range(len(whole)))]  # cut inside characters
    cases += [whole[k:] for k in range(len(whole))]
    for _ in range(2000):
        n = rng.randrange(1, 48)
        cases.append([
            rng.choice(added) if rng.random() < 0.1 else rng.randrange(size + 4) for _ in range(n)
        ])  # fmt: skip
    for ids in cases:
        assert decoder(ids) == backend.decode(ids, skip_special_tokens=False), ids
    if not tok.clean_up_tokenization_spaces:
        assert isinstance(text_decoder(tok), ByteLevelDecoder)  # the one the gateway uses


def test_a_tokenizer_that_is_not_byte_level_is_left_to_its_own_decode() -> None:
    from tokenizers import Tokenizer, decoders, models

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece()
    assert byte_level_decoder(backend) is None


def test_a_probe_that_disagrees_refuses_the_table(monkeypatch) -> None:
    backend = tokenizer("smollm2").backend_tokenizer
    real = ByteLevelDecoder._learn

    def wrong(self, token_id: int) -> bytes:  # an added token read through the byte map
        raw = real(self, token_id)
        return raw.upper() if raw.startswith(b"<|") else raw

    monkeypatch.setattr(ByteLevelDecoder, "_learn", wrong)
    assert byte_level_decoder(backend) is None
