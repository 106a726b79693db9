"""The gateway's one JSON encoder: orjson, to bytes.

Every reply, stream frame, engine request and stored record is encoded here. orjson is
several times faster than the standard library on the shapes the gateway writes
(messages, logprob lists), which matters on a path that runs once per agent turn
(docs/benchmarks.md). Keys must be strings; a NaN or infinite float is written as
`null`, which a JSON reader accepts (the standard library would write `NaN`, which
strict readers refuse, or raise).
"""

from __future__ import annotations

from typing import Any

import orjson


def dumps(data: Any) -> bytes:
    return orjson.dumps(data)


def dumps_text(data: Any) -> str:
    """For a library that wants `str` (SQLAlchemy's JSON columns)."""
    return orjson.dumps(data).decode()


def dumps_sorted(data: Any) -> bytes:
    """Canonical bytes for hashing: keys sorted, anything unusual written as its str."""
    return orjson.dumps(data, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
