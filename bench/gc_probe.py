"""`turnstile serve`, with Python's garbage-collector pauses logged (and optionally frozen).

For the benchmark's GC experiment only: it runs the unchanged gateway CLI, after
registering a `gc.callbacks` hook that writes one line per collection,
`<generation> <milliseconds>`, to --log (flushed at each full collection and on
SIGUSR1). With --freeze it first imports what the gateway imports and loads the
tokenizer, then calls `gc.freeze()`, so that the ~0.5 M objects of
torch/transformers/the tokenizer are never scanned again: the fix this experiment
measures.

    python -m bench.gc_probe --log /tmp/gc.log [--freeze] serve --engine fake ...
"""

from __future__ import annotations

import argparse
import atexit
import gc
import signal
import sys
import time


def install(log_path: str) -> None:
    log = open(log_path, "w", buffering=1 << 16)  # noqa: SIM115 (closed at exit)
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - started[0]) * 1000.0
        log.write(f"{info['generation']} {ms:.3f}\n")
        if info["generation"] == 2:
            log.flush()

    gc.callbacks.append(on_gc)
    atexit.register(log.close)
    # SIGUSR1: flush now, so that the benchmark can mark where its measured run begins.
    signal.signal(signal.SIGUSR1, lambda *_: log.flush())


def freeze_after_imports() -> int:
    import gateway.app  # noqa: F401  (torch, transformers, fastapi, sqlalchemy, ...)
    from gateway.inference.model_source import load_tokenizer, resolve_model_dir

    load_tokenizer(resolve_model_dir(None))
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", required=True)
    p.add_argument("--freeze", action="store_true")
    args, rest = p.parse_known_args()
    if args.freeze:
        print(f"gc.freeze(): {freeze_after_imports()} objects frozen", flush=True)
    install(args.log)
    from trainer.cli import main as turnstile

    return turnstile(rest)


if __name__ == "__main__":
    sys.exit(main())
