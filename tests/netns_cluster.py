"""Two "machines" on one: network namespaces joined by a veth pair (needs root).

Each namespace has its own loopback and one end of the pair (10.<a>.<b>.1 and .2), so
a process bound to node A's address is reached from node B over that link only, as
across machines. The filesystem is shared (the model, run folders, PostgreSQL's Unix
socket). Every process is started here as a child in its own session and stopped by
its own id; on the way out, whatever is still inside a namespace (things the children
started) is killed by pid, and the namespaces and link are deleted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.procs import Child


@dataclass
class Node:
    name: str  # the namespace
    ip: str
    ifname: str  # its end of the veth pair


@dataclass
class TwoNodes:
    work: Path
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.a = Node(f"tsn-a-{self.tag}", f"{subnet}.1", f"tsa{self.tag}")
        self.b = Node(f"tsn-b-{self.tag}", f"{subnet}.2", f"tsb{self.tag}")
        # Ray's Unix sockets live under its temp dir, whose path must stay short
        self.short = Path(tempfile.mkdtemp(prefix="tsn"))

    # ---- the link ----------------------------------------------------------------------
    def up(self) -> TwoNodes:
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            for node in (self.a, self.b):
                _ip("netns", "add", node.name)
                _ip("-n", node.name, "link", "set", "lo", "up")
            _ip("link", "add", self.a.ifname, "type", "veth", "peer", "name", self.b.ifname)
            for node in (self.a, self.b):
                _ip("link", "set", node.ifname, "netns", node.name)
                _ip("-n", node.name, "addr", "add", f"{node.ip}/24", "dev", node.ifname)
                _ip("-n", node.name, "link", "set", node.ifname, "up")
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every child, then anything left in the namespaces, then remove them."""
        for child in reversed(self.children):
            child.stop()
        for node in (self.a, self.b):
            done = subprocess.run(
                ["ip", "netns", "pids", node.name], capture_output=True, text=True
            )
            for pid in done.stdout.split():
                _stop(int(pid), grace_s=2.0)
            subprocess.run(["ip", "netns", "del", node.name], capture_output=True)
        shutil.rmtree(self.short, ignore_errors=True)
        # deleting a namespace deletes its end of the pair, and with it the other end

    def __enter__(self) -> TwoNodes:
        return self.up()

    def __exit__(self, *_: object) -> None:
        self.down()

    # ---- processes ---------------------------------------------------------------------
    def start(self, node: Node, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        """`argv` inside `node`'s namespace, as a child in its own session (bench/procs.py),
        its output in <work>/<name>.log."""
        child = Child(name, ["ip", "netns", "exec", node.name, *argv], self.work, env)
        self.children.append(child)
        return child

    def run(self, node: Node, argv: Sequence[str], timeout_s: float = 60) -> str:
        """A short command inside `node`'s namespace; its stdout."""
        done = subprocess.run(
            ["ip", "netns", "exec", node.name, *argv],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        )  # fmt: skip
        return done.stdout

    def log(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def logs(self) -> str:
        """The end of every child's log, to say why something did not happen."""
        return "\n".join(
            f"---- {p.stem}\n{self.log(p.stem)}" for p in sorted(self.work.glob("*.log"))
        )


def child_named(pid: int, name: str) -> int | None:
    """The pid of the descendant of `pid` whose executable is `name` (e.g. raylet)."""
    try:
        for child in psutil.Process(pid).children(recursive=True):
            if child.name() == name:
                return child.pid
    except psutil.NoSuchProcess:
        return None
    return None


def wait_for(check, timeout_s: float, what: str, every_s: float = 0.5):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _stop(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM `pid` and its process group (its own session), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            time.sleep(0.1)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)
