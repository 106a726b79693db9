"""Token ids -> the text of each token, and the colour class of a logprob.

Each token is decoded on its own (special tokens kept), so what the page shows is
the stored id's text; only a character that byte-level tokens split is shown whole on
the token that completes it. Decoded texts are cached per id: a vocabulary is small
and sessions repeat their prompts.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.lru import LRU

# probability bands, high to low: p >= 0.9, 0.5, 0.2, 0.05, 0.01, below (docs/viewer.md)
_BANDS = (0.9, 0.5, 0.2, 0.05, 0.01)
_BROKEN = "\ufffd"  # what a lone byte of a multi-byte character decodes to
_MAX_CHAR_TOKENS = 4  # UTF-8 characters are at most 4 bytes


class TokenTexts:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: LRU[int, str] = LRU(65_536)

    def _singles(self, ids: list[int]) -> list[str]:
        missing = sorted({i for i in ids if self._cache.get(i) is None})
        if missing:
            decoded = self.tokenizer.batch_decode([[i] for i in missing], skip_special_tokens=False)
            for i, text in zip(missing, decoded, strict=True):
                self._cache.put(i, text)
        return [self._cache.get(i) or "" for i in ids]

    def texts(self, ids: list[int]) -> list[str]:
        """One text per token, joined they are `decode(ids)`. A character split over
        several byte tokens is carried by the token that completes it; the tokens
        before it are empty (the page marks them as partial)."""
        singles = self._singles(ids)
        out: list[str] = []
        k = 0
        while k < len(ids):
            if _BROKEN not in singles[k]:
                out.append(singles[k])
                k += 1
                continue
            for j in range(k + 1, min(len(ids), k + _MAX_CHAR_TOKENS) + 1):
                group = self.tokenizer.decode(ids[k:j], skip_special_tokens=False)
                if not group.endswith(_BROKEN):
                    out += [""] * (j - k - 1) + [group]
                    k = j
                    break
            else:  # bytes that never form a character: show them as they decode
                out.append(singles[k])
                k += 1
        return out


def logprob_band(logprob: float | None) -> int:
    """0 (confident, p >= 0.9) .. 5 (p < 0.01); -1 where there is no logprob."""
    if logprob is None or math.isnan(logprob):
        return -1
    return sum(math.exp(logprob) < edge for edge in _BANDS)  # the edges it is below
