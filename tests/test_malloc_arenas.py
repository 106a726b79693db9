"""`turnstile serve` holds glibc to 2 malloc arenas: without the limit each thread that
allocates (the recorder's, the thread pool's) gets an arena of its own, which keeps what
it freed (bench/rss.py: ~5 MB of a gateway's RSS after 20,000 sessions)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest

# six threads allocating at once, then glibc's own count of its heaps (malloc_info)
PROBE = """
import ctypes, ctypes.util, sys, tempfile, threading
if sys.argv[1] == "limited":
    from gateway.malloc import limit_arenas
    limit_arenas()
held, barrier = [], threading.Barrier(6)
def work():
    barrier.wait()
    held.append([bytes(1000) for _ in range(2000)])
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
fp = ctypes.c_void_p(libc.fopen(path.encode(), b"w"))
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
"""


def _heaps(mode: str) -> int:
    root = Path(__file__).resolve().parent.parent
    env = {"PYTHONPATH": str(root)}  # (no MALLOC_ARENA_MAX: it would win)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_info"),
    reason="glibc only: elsewhere limit_arenas is a no-op",
)
def test_serve_holds_malloc_to_two_arenas() -> None:
    assert _heaps("unlimited") > 2  # the probe does make arenas
    assert _heaps("limited") <= 2
