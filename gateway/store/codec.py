"""Compact binary encoding of token arrays: 4 bytes a token instead of a JSON list."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

_LITTLE = sys.byteorder == "little"


def pack_ints(values: Sequence[int]) -> bytes:
    arr = array("i", values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def unpack_ints(blob: bytes | None) -> list[int]:
    if not blob:
        return []
    arr = array("i")
    arr.frombytes(blob)
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()


def pack_floats(values: Sequence[float]) -> bytes:
    arr = array("f", values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def unpack_floats(blob: bytes | None) -> list[float]:
    if not blob:
        return []
    arr = array("f")
    arr.frombytes(blob)
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()
