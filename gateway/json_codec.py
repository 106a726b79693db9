"""The gateway's one JSON codec: orjson, several times faster than the standard library
on the gateway's shapes (replies, frames, engine requests, records: docs/benchmarks.md).
A NaN or infinite float is written as `null`, which every JSON reader accepts.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from gateway.token_ids import TokenIds


def dumps(data: Any) -> bytes:
    try:
        return orjson.dumps(data, default=_plain)
    except orjson.JSONEncodeError:
        return _dumps_slow(data).encode()


def _plain(value: Any) -> Any:
    """What orjson cannot write as it is: prompt ids kept as chunks (token_ids.py)."""
    if isinstance(value, TokenIds):
        return value.flat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def loads(raw: bytes | str) -> Any:
    """orjson, else the standard library, which takes what orjson refuses (`NaN` logprobs,
    integers past 64 bits) and raises ValueError on what is not JSON at all."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def dumps_text(data: Any) -> str:
    """For a library that wants `str` (SQLAlchemy's JSON columns)."""
    return dumps(data).decode()


def dumps_sorted(data: Any) -> bytes:
    """Canonical bytes for hashing: keys sorted, anything unusual written as its str."""
    try:
        return orjson.dumps(
            data, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
        )
    except orjson.JSONEncodeError:
        return _dumps_slow(data, sort_keys=True).encode()


def _dumps_slow(data: Any, sort_keys: bool = False) -> str:
    """For integers past 64 bits, which orjson refuses and a client may send (found by
    the fuzzer: such a request failed to record); non-finite floats still become null."""
    return json.dumps(
        _finite(data), separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys, default=str
    )


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple, TokenIds)):
        return [_finite(v) for v in data]
    return data
