"""`rollout.agent.mode: subproc`: running the agent in a pool of worker processes.

Each call ships a pickled copy of the agent and the data row to an idle worker. The
worker sets ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` to the session's gateway URL and key
(a worker runs one call at a time, so that is safe), runs ``asyncio.run(agent.run(data))``
with no extra kwargs, as AReaL's subproc mode does, and sends the return value back.
A synchronous agent building ``openai.OpenAI()`` from the environment works unchanged.

Workers are started with "spawn" (never fork: the trainer has torch threads and an event
loop), lazily, at most ``max_workers`` of them. Each worker is its own process with its
own pipe, so one that dies (``os._exit``, a segfault, the OOM killer) fails only the call
it was running; the next call starts a fresh worker. Classes from files loaded by
``trainer.loading`` ("path/file.py:Class") live in modules with generated names that a
fresh interpreter cannot import, so each call also ships those files' paths and the
worker imports them (``trainer.loading.import_file``: the same names) before unpickling.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import multiprocessing
import multiprocessing.util  # its exit hook (joins children) must run after ours
import os
import pickle
import signal
import sys
import threading
import traceback
import weakref
from multiprocessing.connection import Connection
from typing import Any

from trainer.loading import WorkflowError, import_file

log = logging.getLogger(__name__)

__all__ = [
    "SubprocAgentError",
    "SubprocAgentPool",
    "SubprocPicklingError",
    "SubprocWorkerDied",
    "check_picklable",
]

# The prefix trainer.loading gives modules it loads from a file path.
FILE_MODULE_PREFIX = "turnstile_workflow_"
ENV_KEYS = ("OPENAI_BASE_URL", "OPENAI_API_KEY")
CLOSE_GRACE_S = 2.0


class SubprocPicklingError(WorkflowError):
    """The agent, the data, or the agent's return value cannot cross the process boundary."""


class SubprocWorkerDied(RuntimeError):
    """The worker process running the agent exited before it answered."""


class SubprocAgentError(RuntimeError):
    """An agent exception that could not be sent back as itself.

    Raised as a subclass named after the agent's exception type, so that
    ``type(exc).__name__`` and ``str(exc)`` read as the original did; the worker's
    traceback is in ``remote_traceback``.
    """

    remote_type = "SubprocAgentError"
    remote_traceback = ""


def _type_name(obj: Any) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    module = getattr(t, "__module__", None)
    return t.__qualname__ if module in (None, "builtins") else f"{module}.{t.__qualname__}"


def check_picklable(obj: Any, what: str) -> bytes:
    """``pickle.dumps(obj)``, or a SubprocPicklingError that says what could not pickle."""
    try:
        return pickle.dumps(obj)
    except Exception as exc:
        culprit = _culprit(obj, what, depth=3)
        raise SubprocPicklingError(
            f"rollout.agent.mode is 'subproc': the {what} must be picklable to be sent to a "
            f"worker process, but pickling the {what} ({_type_name(obj)}) failed"
            f"{f' at {culprit}' if culprit else ''}: "
            f"{type(exc).__name__}: {exc}. Drop or recreate the unpicklable attribute "
            "(locks, lambdas, open clients, sockets) inside `run`, or use "
            "rollout.agent.mode: inline."
        ) from exc


def _culprit(obj: Any, where: str, depth: int) -> str | None:
    """Where in ``obj`` (an attribute or a key, a few levels down) pickling fails."""
    if depth == 0:
        return None
    if isinstance(obj, dict):
        items = [(f"{where}[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
    elif isinstance(getattr(obj, "__dict__", None), dict):
        items = [(f"{where}.{k}", v) for k, v in vars(obj).items()]
    else:
        return None
    for path, value in items:
        try:
            pickle.dumps(value)
        except Exception:
            deeper = _culprit(value, path, depth - 1)
            return deeper or f"{path} ({_type_name(value)})"
    return None


def file_modules() -> tuple[str, ...]:
    """The file of every agent module trainer.loading loaded by path."""
    modules = list(sys.modules.items())
    return tuple(
        sorted(
            m.__file__
            for name, m in modules
            if name.startswith(FILE_MODULE_PREFIX) and getattr(m, "__file__", None)
        )
    )


# ---- the worker side -------------------------------------------------------------------


def _error_reply(kind: str, exc: BaseException, note: str = "") -> bytes:
    tb = "".join(traceback.format_exception(exc))
    try:
        message = str(exc)
    except Exception:
        message = repr(exc)
    message += note
    try:  # the exception itself (the trainer falls back to its name if it cannot load it)
        blob: bytes | None = pickle.dumps(exc)
    except Exception:
        blob = None
    return pickle.dumps((kind, type(exc).__name__, message, tb, blob))


def _run_job(job: bytes) -> bytes:
    modules, agent_blob, data_blob, base_url, api_key = pickle.loads(job)
    # the shipped agent files, under the trainer's module names (import_file derives the
    # name from the path); what failed matters only if the agent or data cannot load
    failed = []
    for path in modules:
        try:
            import_file(path)
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
    try:
        agent = pickle.loads(agent_blob)
        data = pickle.loads(data_blob)
    except Exception as exc:
        note = ("; agent files that failed to import: " + "; ".join(failed)) if failed else ""
        return _error_reply("load", exc, note)
    # every call sets both: none sees the previous call's
    os.environ.update(zip(ENV_KEYS, (base_url, api_key), strict=True))
    try:
        value = asyncio.run(agent.run(data))
    except BaseException as exc:  # SystemExit from the agent is its error too
        return _error_reply("agent", exc)
    try:
        return pickle.dumps(("ok", pickle.dumps(value)))
    except Exception as exc:
        return pickle.dumps(("result", _type_name(value), f"{type(exc).__name__}: {exc}"))


def _worker_main(conn: Connection) -> None:
    # Ctrl-C in the terminal reaches the whole process group; the trainer shuts us down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            job = conn.recv_bytes()
        except (EOFError, OSError):  # the trainer closed the pipe or went away
            return
        reply = _run_job(job)
        try:
            conn.send_bytes(reply)
        except OSError:
            return


# ---- the trainer side ------------------------------------------------------------------


class _Worker:
    def __init__(self, ctx: Any, name: str) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child,), name=name, daemon=False)
        self.process.start()
        child.close()  # so a dead worker reads as EOF here
        self.calls = 0

    def stop(self, grace_s: float, close_pipe: bool = True) -> None:
        if close_pipe:  # an idle worker exits on EOF
            self.conn.close()
        self.process.join(grace_s)
        for end in (self.process.terminate, self.process.kill):  # kill: it ignored SIGTERM
            if self.process.is_alive():
                end()
                self.process.join(1.0)


_live_pools: weakref.WeakSet[SubprocAgentPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:  # pragma: no cover - exercised at interpreter exit
    for pool in list(_live_pools):
        pool.close(grace_s=0.5)


class SubprocAgentPool:
    """Up to ``max_workers`` spawned processes running ``agent.run``; see the module doc."""

    def __init__(self, max_workers: int = 4) -> None:
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise WorkflowError(
                f"rollout.agent.subproc_max_workers must be an integer >= 1, got {max_workers!r}"
            )
        self.max_workers = max_workers
        self._ctx = multiprocessing.get_context("spawn")
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._spawned = 0
        self._closed = False
        _live_pools.add(self)

    def worker_pids(self) -> list[int]:
        with self._cond:
            workers = [*self._idle, *self._busy]
            return [w.process.pid for w in workers if w.process.pid is not None]

    async def run(self, agent: Any, data: Any, *, base_url: str, api_key: str) -> Any:
        """``agent.run(data)`` in a worker, with the session's URL and key in its env."""
        if self._closed:
            raise RuntimeError("the subproc agent pool is closed")
        job = pickle.dumps(
            (
                file_modules(),
                check_picklable(agent, "agent"),
                check_picklable(data, "data"),
                base_url,
                api_key,
            )
        )
        cancelled = threading.Event()
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        done.set_running_or_notify_cancel()  # the thread answers; a cancelled caller drops it

        def target() -> None:
            try:
                done.set_result(self._call(job, cancelled))
            except BaseException as exc:
                done.set_exception(exc)

        # A daemon thread per call waits on the pipe, so a stuck agent never blocks exit.
        threading.Thread(target=target, name="subproc-agent-call", daemon=True).start()
        try:
            reply = await asyncio.wrap_future(done)
        except asyncio.CancelledError:
            cancelled.set()  # a call still waiting for a worker is dropped
            raise
        return self._unpack(reply)

    def _call(self, job: bytes, cancelled: threading.Event) -> Any:
        worker = self._checkout(cancelled)
        healthy = False
        try:
            try:
                worker.conn.send_bytes(job)
                reply = worker.conn.recv_bytes()
            except (EOFError, OSError):
                worker.process.join(5.0)
                code = worker.process.exitcode
                if self._closed:
                    raise SubprocWorkerDied(
                        "the subproc agent pool was closed while the agent was running"
                    ) from None
                hint = ""
                if worker.calls == 0:  # e.g. a script without a __main__ guard, re-run by spawn
                    hint = (
                        "; it had not finished any run yet: its stderr says why (a training "
                        "script must start the trainer under `if __name__ == '__main__':`)"
                    )
                raise SubprocWorkerDied(
                    f"the agent's worker process (pid {worker.process.pid}) died while running "
                    f"the agent (exit code {code}); a fresh worker takes the next run{hint}"
                ) from None
            worker.calls += 1
            healthy = True
            return pickle.loads(reply)
        finally:
            self._checkin(worker, healthy)

    def _checkout(self, cancelled: threading.Event) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the subproc agent pool is closed")
                if cancelled.is_set():
                    raise asyncio.CancelledError()
                while self._idle:
                    worker = self._idle.pop()
                    if worker.process.is_alive():
                        self._busy.add(worker)
                        return worker
                    worker.stop(grace_s=0.0)  # it died idle (the OOM killer, a kill)
                if len(self._busy) + self._starting < self.max_workers:
                    self._starting += 1
                    self._spawned += 1
                    name = f"turnstile-agent-{self._spawned}"
                    break
                self._cond.wait()
        try:
            worker = _Worker(self._ctx, name)
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            self._busy.add(worker)
            closed = self._closed
        if closed:
            self._checkin(worker, healthy=False)
            raise RuntimeError("the subproc agent pool is closed")
        log.debug("started agent worker %s (pid %s)", name, worker.process.pid)
        return worker

    def _checkin(self, worker: _Worker, healthy: bool) -> None:
        with self._cond:
            self._busy.discard(worker)
            keep = healthy and not self._closed and worker.process.is_alive()
            if keep:
                self._idle.append(worker)
            self._cond.notify()
        if not keep:
            worker.stop(grace_s=0.0 if not healthy else CLOSE_GRACE_S)

    @staticmethod
    def _unpack(reply: tuple[Any, ...]) -> Any:
        kind = reply[0]
        if kind == "ok":
            try:
                return pickle.loads(reply[1])
            except Exception as exc:
                raise SubprocPicklingError(
                    "the agent's return value could not be unpickled in the trainer: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if kind == "result":
            _, type_name, why = reply
            raise SubprocPicklingError(
                f"rollout.agent.mode is 'subproc': the agent's return value ({type_name}) "
                f"could not be pickled back to the trainer: {why}. Return a float or a "
                "dict of completion id -> float, or use rollout.agent.mode: inline."
            )
        _, type_name, message, tb, blob = reply
        if kind == "load":
            raise SubprocPicklingError(
                "rollout.agent.mode is 'subproc': the worker process could not load the "
                f"agent or the data: {type_name}: {message}. The agent's class must be "
                "importable in a fresh interpreter (a module on sys.path or a "
                "'path/file.py:Class' workflow), or use rollout.agent.mode: inline.\n"
                f"Worker traceback:\n{tb}"
            )
        try:
            exc = pickle.loads(blob) if blob is not None else None
        except Exception:
            exc = None
        if not isinstance(exc, Exception):  # not sent as itself, or SystemExit etc.
            attrs = {"remote_type": type_name, "remote_traceback": tb}
            exc = type(type_name, (SubprocAgentError,), attrs)(message)
        exc.add_note(f"Worker traceback:\n{tb}")
        raise exc

    def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop every worker (idle ones at once; busy ones are terminated). Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle, busy = list(self._idle), list(self._busy)
            self._idle.clear()
            self._cond.notify_all()
        _live_pools.discard(self)
        # A busy worker's pipe belongs to the thread waiting on it: end the process and
        # that thread sees EOF (and closes the pipe). An idle one exits when its pipe closes.
        for worker in busy:
            worker.process.terminate()
        for worker in [*idle, *busy]:
            worker.stop(grace_s, close_pipe=worker in idle)

    def __enter__(self) -> SubprocAgentPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
