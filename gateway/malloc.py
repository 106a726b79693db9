"""Keeping glibc's allocator from hoarding freed memory: the gateway's and the trainer's.

glibc gives each thread that allocates an arena of its own (the recorder's, the thread
pool's, the engine's, the trainer's), each keeping what it freed, and rarely returns
freed memory to the system. Held to 2 arenas, a gateway behind an external engine holds
~5 MB less after 20,000 sessions (docs/benchmarks.md, rss), and a training run's RSS
stays flat where it grew step by step (a 12-step run hit 24 GB and was OOM-killed).
Both are no-ops where glibc is not the allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
_name = ctypes.util.find_library("c")
_LIBC = ctypes.CDLL(_name) if _name else None


def limit_arenas(count: int = 2) -> None:
    """At most `count` arenas (call it before the threads start); `MALLOC_ARENA_MAX`,
    where set, wins."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, count)


def release_free_memory() -> None:
    """Give what the process freed back to the system (after a training step; after
    reading tokenizer.json, whose text and parse tree are ~14 MB for SmolLM2's)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
