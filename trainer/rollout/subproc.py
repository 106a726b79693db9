"""`rollout.agent.mode: subproc`: running the agent in a pool of worker processes.

Each call ships a pickled copy of the agent and the data row to an idle worker. The
worker sets ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` to the session's gateway URL and key
(a worker runs one call at a time, so that is safe), runs ``asyncio.run(agent.run(data))``
with no extra kwargs, as AReaL's subproc mode does, and sends the return value back.
A synchronous agent building ``openai.OpenAI()`` from the environment works unchanged.

The workers are a pebble ``ProcessPool`` of ``max_workers`` processes, started with
"spawn" (never fork: the trainer has torch threads and an event loop) at the first call.
One that dies (``os._exit``, a segfault, the OOM killer) fails only the call it was
running, and pebble starts a fresh worker. Classes from files loaded by
``trainer.loading`` ("path/file.py:Class") live in modules with generated names that a
fresh interpreter cannot import, so each call also ships those files' paths and the
worker imports them (``trainer.loading.import_file``: the same names) before unpickling.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
from concurrent.futures import InvalidStateError
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pebble

from trainer.loading import WorkflowError, import_file

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
# a worker that died having finished no run yet (e.g. a script without a __main__ guard,
# re-run by spawn) says why on its stderr
NO_RUN_HINT = (
    "; it had not finished any run yet: its stderr says why (a training "
    "script must start the trainer under `if __name__ == '__main__':`)"
)


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


def _run_in_worker(job: bytes) -> tuple[int, bytes]:
    """``_run_job``, and which worker ran it (``worker_pids``)."""
    return os.getpid(), _run_job(job)


# ---- the trainer side ------------------------------------------------------------------


class SubprocAgentPool:
    """``max_workers`` spawned processes running ``agent.run``; see the module doc."""

    def __init__(self, max_workers: int = 4) -> None:
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise WorkflowError(
                f"rollout.agent.subproc_max_workers must be an integer >= 1, got {max_workers!r}"
            )
        self.max_workers = max_workers
        self._pool = self._new_pool()  # its workers start with the first call
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[pebble.ProcessFuture] = set()
        self._answered: set[int] = set()  # pids of workers that finished a run

    def _new_pool(self) -> pebble.ProcessPool:
        # Ctrl-C in the terminal reaches the whole process group; the trainer shuts us down.
        return pebble.ProcessPool(
            self.max_workers,
            context=multiprocessing.get_context("spawn"),
            initializer=signal.signal,
            initargs=(signal.SIGINT, signal.SIG_IGN),
        )

    def worker_pids(self) -> list[int]:
        """The live workers that have finished a run."""
        live = {p.pid for p in multiprocessing.active_children()}
        return sorted(self._answered & live)

    async def run(self, agent: Any, data: Any, *, base_url: str, api_key: str) -> Any:
        """``agent.run(data)`` in a worker, with the session's URL and key in its env."""
        job = pickle.dumps(
            (
                file_modules(),
                check_picklable(agent, "agent"),
                check_picklable(data, "data"),
                base_url,
                api_key,
            )
        )
        # A cancelled caller cancels the future: pebble drops the call, or ends its worker.
        try:
            pid, reply = await asyncio.wrap_future(self._schedule(job))
        except (pebble.ProcessExpired, BrokenProcessPool) as exc:
            raise self._died(exc) from None
        self._answered.add(pid)
        return self._unpack(pickle.loads(reply))

    def _schedule(self, job: bytes) -> pebble.ProcessFuture:
        with self._lock:
            if self._closed:
                raise RuntimeError("the subproc agent pool is closed")
            if not self._pool.active:  # pebble gives up on a pool whose worker died between runs
                self._pool.stop()
                self._pool.join()
                self._pool = self._new_pool()
            future = self._pool.schedule(_run_in_worker, args=[job])
            self._calls.add(future)
        future.add_done_callback(self._calls.discard)
        return future

    def _died(self, exc: Exception) -> SubprocWorkerDied:
        if self._closed:
            return SubprocWorkerDied(
                "the subproc agent pool was closed while the agent was running"
            )
        if isinstance(exc, pebble.ProcessExpired):
            hint = "" if exc.pid in self._answered else NO_RUN_HINT
            return SubprocWorkerDied(
                f"the agent's worker process (pid {exc.pid}) died while running "
                f"the agent (exit code {exc.exitcode}); a fresh worker takes the next run{hint}"
            )
        # pebble breaks the pool when a worker dies while no run is known to be running
        return SubprocWorkerDied(
            f"the agent's worker process exited before it could run the agent ({exc}); a "
            f"fresh pool takes the next run{'' if self._answered else NO_RUN_HINT}"
        )

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

    def close(self) -> None:
        """Stop every worker, busy ones too (their calls fail). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.stop()
        self._pool.join()
        for future in list(self._calls):  # pebble may leave the calls it was running pending
            with contextlib.suppress(InvalidStateError):  # answered or cancelled meanwhile
                future.set_exception(BrokenProcessPool("the pool was closed"))

    def __enter__(self) -> SubprocAgentPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
