"""Compact binary encoding of token arrays: 4 bytes a token instead of a JSON list."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

_LITTLE = sys.byteorder == "little"


def _pack(code: str, values: Sequence[Any]) -> bytes:
    arr = array(code, values)
    if not _LITTLE:  # stored little-endian, whatever the machine
        arr.byteswap()
    return arr.tobytes()


def _unpack(code: str, blob: bytes | None) -> list[Any]:
    arr = array(code)
    arr.frombytes(blob or b"")  # (bytes or a driver's memoryview)
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()


def pack_ints(values: Sequence[int]) -> bytes:
    return _pack("i", values)


def unpack_ints(blob: bytes | None) -> list[int]:
    return _unpack("i", blob)


def pack_floats(values: Sequence[float]) -> bytes:
    return _pack("f", values)


def unpack_floats(blob: bytes | None) -> list[float]:
    return _unpack("f", blob)
