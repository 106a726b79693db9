"""A throwaway PostgreSQL server for tests and benchmarks, on loopback at a free port.

Binaries from PATH, else /usr/lib/postgresql/*/bin, else the `pgserver` wheel. PostgreSQL
refuses to run as root, so under root the cluster belongs to an unprivileged user
(`nobody`, or TURNSTILE_PG_USER) and every server command runs through `runuser`.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa

from bench.procs import free_port

DB_USER = "turnstile"


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and postgres."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").exists():
            return Path(candidate)
    # a pip-installable server (the Makefile installs it where the machine has none);
    # found, not imported: only its binaries are used
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin is not None:
        bin_dir = Path(spec.origin).parent / "pginstall" / "bin"
        if (bin_dir / "initdb").exists():
            return bin_dir
    raise RuntimeError(
        "no PostgreSQL server binaries: install PostgreSQL (initdb on PATH) "
        "or `pip install pgserver`"
    )


class PostgresServer:
    """One cluster. `fsync=False` trades power-loss safety for speed (tests only: a
    killed gateway or a stopped server loses nothing either way)."""

    def __init__(self, fsync: bool = True) -> None:
        self.bin_dir = find_bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="turnstile-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.fsync = fsync
        # who owns the cluster: ourselves, unless we are root
        self.os_user = os.environ.get("TURNSTILE_PG_USER", "nobody") if os.geteuid() == 0 else None

    # ---- lifecycle -------------------------------------------------------------------
    def init(self) -> PostgresServer:
        if self.os_user is not None:
            pw = pwd.getpwnam(self.os_user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", DB_USER, "--auth=trust",
                  "--encoding=UTF8", "--no-sync")  # fmt: skip
        return self

    def start(self, timeout_s: float = 60.0) -> PostgresServer:
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories='{self.root}' -c max_connections=300"
            + ("" if self.fsync else " -c fsync=off -c synchronous_commit=off")
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts,
                  "-w", "-t", str(int(timeout_s)), "start")  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        """`fast`: clean shutdown; `immediate`: like a crash (recovery on next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def remove(self) -> None:
        if self.data.exists():  # a stopped server's `stop` is a no-op
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.init().start()

    def __exit__(self, *_: object) -> None:
        self.remove()

    # ---- databases -------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{DB_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; its SQLAlchemy URL."""
        name = name or "t_" + uuid.uuid4().hex[:16]
        engine = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)

    # ---- helpers ---------------------------------------------------------------------
    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / tool), *args]
        if self.os_user is not None:
            argv = ["runuser", "-u", self.os_user, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=self.root)
        if check and done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}):\n{done.stderr}\n{log}")
        return done
