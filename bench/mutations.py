"""Does the learning test catch a broken trainer? Run tests/test_learning.py unbroken and
under each mutation of tests/mutations.py; the unbroken run must pass and every mutated
one fail.

    python -m bench.mutations
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench.procs import checkout_env
from bench.report import ROOT
from tests.mutations import MUTATIONS


def run(mutation: str | None) -> tuple[bool, float, str]:
    env = checkout_env() | {"TURNSTILE_MUTATION": mutation or ""}  # "": unbroken
    started = time.time()
    out = subprocess.run(
        [str(ROOT / ".venv/bin/pytest"), "-q", "-p", "tests.mutations", "tests/test_learning.py"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    # why: pytest's first "E " line, else the output's last line
    output = [*out.stdout.splitlines(), *out.stderr.splitlines()] or [""]
    why = next((ln for ln in out.stdout.splitlines() if ln.startswith("E ")), output[-1])
    return out.returncode == 0, time.time() - started, why.strip()[:160]


def main() -> int:
    ok = True
    for mutation in (None, *MUTATIONS):
        passed, seconds, why = run(mutation)
        expected = mutation is None
        ok &= passed == expected
        verdict = "as it should" if passed == expected else "WRONG"
        name = mutation or "unbroken"
        print(f"{name:18s} {'passed' if passed else 'failed'} ({verdict}, {seconds:.0f} s) {why}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
