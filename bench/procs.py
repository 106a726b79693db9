"""Child processes of a benchmark run: started pinned to a core, always stopped by PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

from bench.report import ROOT

TURNSTILE = str(Path(sys.executable).parent / "turnstile")


def checkout_env() -> dict[str, str]:
    """The children's environment: this checkout's code (PYTHONPATH), not an installed
    copy, and nothing fetched from a hub."""
    offline = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT), **offline)
    env.setdefault("TURNSTILE_CACHE", str(ROOT / ".cache"))
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def can_pin(*cores: int) -> bool:
    return all(c in os.sched_getaffinity(0) for c in cores)


class Child:
    """One server process (e.g. `taskset -c 0 turnstile serve ...`), logging to a file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        # A session of its own: Ctrl-C in the terminal reaches only the runner, which
        # then stops its children one by one, by PID.
        self.popen = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.proc = psutil.Process(self.popen.pid)  # taskset execs: this is the server

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_seconds(self) -> float:
        """CPU time of the process, all its threads: from the scheduler's nanosecond
        counts where Linux has them (psutil's user + system time moves in 10 ms ticks,
        too coarse for the few requests of one session's turn), else psutil's."""
        try:
            return sum(_run_ns(task) for task in Path(f"/proc/{self.pid}/task").iterdir()) / 1e9
        except (OSError, ValueError):
            t = self.proc.cpu_times()
            return t.user + t.system

    def log_tail(self, n: int = 40) -> str:
        self._log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_http(self, url: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout_s} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def kill_hard(self) -> None:
        """SIGKILL: what the store check runs after (a 200 must survive a crash)."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, grace_s: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill_hard()
        self._log.close()


class Children:
    """Every child of the run; `stop_all()` (in a `finally`) ends each of them by PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.env = checkout_env()
        self.items: list[Child] = []

    def start(self, name: str, argv: list[str], health: str | None = None) -> Child:
        """Start a child; with `health`, also wait until that URL answers 200."""
        child = Child(name, argv, self.log_dir, self.env)
        self.items.append(child)
        if health:
            child.wait_http(health)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.items):
            try:
                child.stop()
            except Exception as exc:  # keep stopping the others
                print(f"warning: could not stop {child.name} (pid {child.pid}): {exc}")


def _run_ns(task: Path) -> int:
    """Nanoseconds a thread has run (the first field of its schedstat); 0 when it has
    exited meanwhile."""
    try:
        return int((task / "schedstat").read_text().split()[0])
    except FileNotFoundError:
        return 0


@contextlib.contextmanager
def run_children(prefix: str) -> Iterator[Children]:
    """A run's children, logging into a new temp folder: all stopped by PID at the end;
    the folder (logs, stores of ~100 MB) removed, unless the run failed."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    children, ok = Children(work), False
    try:
        yield children
        ok = True
    finally:
        children.stop_all()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"servers' logs and stores: {work}")
