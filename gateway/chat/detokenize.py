"""Output tokens -> text, incrementally, with stop strings.

Text is released only once final: never half a character, nor what may start a stop
string. At a stop string the text is cut before it and `kept_ids` are the fewest output
tokens whose text reaches it, so what the client got and what is recorded agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any

from gateway.chat.byte_level_decoder import byte_level_decoder


def text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """Ids -> text, special tokens kept: where the Rust decode gives transformers' text
    (no space clean-up), a byte-level table if it applies, else the Rust decode (a third
    of transformers' CPU a call); else transformers'."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return byte_level_decoder(backend) or partial(backend.decode, skip_special_tokens=False)
    return partial(tokenizer.decode, skip_special_tokens=False)


def partial_suffix_len(text: str, needles: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper start of one of `needles`."""
    longest = max((len(n) for n in needles), default=0)
    for size in range(min(longest - 1, len(text)), 0, -1):
        tail = text[-size:]
        if any(n.startswith(tail) for n in needles):
            return size
    return 0


class IncrementalDecoder:
    def __init__(
        self,
        decode: Callable[[list[int]], str],
        stop_token_ids: Collection[int],
        stop_strings: Sequence[str] = (),
    ) -> None:
        """`decode`: ids -> text, special tokens kept (`text_decoder`'s)."""
        self._decode_ids = decode
        self._special = frozenset(stop_token_ids)
        self.stops = [s for s in stop_strings if s]
        self._max_stop = max((len(s) for s in self.stops), default=0)
        self.ids: list[int] = []  # every output token received
        self._text_ids: list[int] = []  # the ones that carry text (not the final stop token)
        self.text = ""  # decoded so far
        self._sent = 0  # characters of `text` released
        self._prefix_offset = 0  # vLLM-style incremental detokenisation window
        self._read_offset = 0
        self._prefix_text: str | None = ""
        self.cut: int | None = None  # where a stop string starts in `text`
        self._keep: int | None = None

    @property
    def stopped(self) -> bool:
        """A stop string was found: the caller may stop generating."""
        return self.cut is not None

    @property
    def kept_ids(self) -> list[int]:
        return self.ids if self._keep is None else self.ids[: self._keep]

    @property
    def final_text(self) -> str:
        return self.text if self.cut is None else self.text[: self.cut]

    def feed(self, token_ids: Sequence[int]) -> str:
        """Add output tokens; return the text that became final."""
        if self.cut is not None:
            return ""
        self.ids.extend(token_ids)
        self._text_ids.extend(t for t in token_ids if t not in self._special)
        self._decode(final=False)
        return self._release(final=False)

    def finish(self) -> str:
        """No more tokens: release everything that is left (up to a stop string)."""
        if self.cut is None:
            self._decode(final=True)
        return self._release(final=True)

    # ---- internals -------------------------------------------------------------------
    def _decode(self, final: bool) -> None:
        ids = self._text_ids
        if self._read_offset == len(ids):
            return
        if self._prefix_text is None:  # computed lazily: a single feed never needs it
            self._prefix_text = self._piece(self._prefix_offset, self._read_offset)
        full = self._piece(self._prefix_offset, len(ids))
        if not final and full.endswith("\ufffd"):
            return  # an incomplete UTF-8 sequence: wait for its next byte
        before = len(self.text)
        clean_upto = self._read_offset
        self.text += full[len(self._prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        self._prefix_text = None
        if self.stops:
            self._find_stop(max(0, before - self._max_stop + 1), clean_upto)

    def _piece(self, start: int, end: int) -> str:
        if start == end:
            return ""
        return self._decode_ids(self._text_ids[start:end])

    def _find_stop(self, search_from: int, clean_upto: int) -> None:
        # (end, start) of each stop string found: the one completed first wins
        hits = [(i + len(s), i) for s in self.stops if (i := self.text.find(s, search_from)) >= 0]
        if not hits:
            return
        self.cut = min(hits)[1]
        # Fewest tokens whose text contains a stop string (binary search: it grows with k).
        lo, hi = clean_upto + 1, len(self._text_ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in self._piece(0, mid) for s in self.stops):
                hi = mid
            else:
                lo = mid + 1
        self._keep = hi

    def _release(self, final: bool) -> str:
        end = len(self.text)
        if self.cut is not None:
            end = self.cut
        elif not final and self.stops:
            end -= partial_suffix_len(self.text, self.stops)
        out = self.text[self._sent : end]
        self._sent = max(self._sent, end)
        return out
