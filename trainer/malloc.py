"""Keeping glibc's allocator from hoarding memory across threads.

Training allocates gigabytes of differently sized tensors every step. glibc gives each
thread its own arena and rarely returns freed memory, so with the engine, the gateway
and the trainer on different threads the resident size only grows (a 12-step run hit
24 GB and was OOM-killed). Capping the arenas and trimming after each step keeps it
flat. No-ops where glibc is not the allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - probe: glibc only
        libc.malloc_trim  # noqa: B018
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def limit_arenas(count: int = 2) -> None:
    if _LIBC is not None:
        _LIBC.mallopt(_M_ARENA_MAX, count)


def release_free_memory() -> None:
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
