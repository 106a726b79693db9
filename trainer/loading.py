"""Loading the user's agent: a class, "module.Class", or "path/to/file.py:Class"."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any


class WorkflowError(ValueError):
    pass


def load_workflow_class(spec: str | type) -> type:
    cls = load_class(spec, "workflow")
    return _playable(cls, cls.__name__)


def _playable(obj: Any, name: str) -> Any:
    """`obj` (a class or an instance) if it can play episodes, else the error saying how."""
    if not any(inspect.iscoroutinefunction(getattr(obj, m, None)) for m in ("run", "arun_episode")):
        raise WorkflowError(
            f"{name} needs `async def run(self, data, **extra_kwargs)` (an agent) or "
            "`async def arun_episode(self, engine, data)` (a RolloutWorkflow)"
        )
    return obj


def import_files(paths: list[str]) -> None:
    """Import Python files by path, e.g. ones that call register_agent / register_env."""
    for path in paths:
        import_file(path)


def load_class(spec: str | type, what: str = "class") -> type:
    """A class from "module.Class" or "path/file.py:Class"."""
    cls = load_object(spec, what)
    if not isinstance(cls, type):
        raise WorkflowError(f"{spec} is not a class")
    return cls


def load_object(spec: Any, what: str = "object") -> Any:
    """A class or function from "module.name" or "path/file.py:name"; objects pass through."""
    if not isinstance(spec, str):
        if not callable(spec):
            raise WorkflowError(f"{what} must be a class or a string, got {spec!r}")
        cls = spec
    elif not spec:
        raise WorkflowError(f"{what} must be a class or a string, got {spec!r}")
    elif ":" in spec and (spec.split(":", 1)[0].endswith(".py") or "/" in spec):
        path, attr = spec.rsplit(":", 1)
        cls = _attr(import_file(path), attr, spec)
    elif "." in spec:
        module_name, _, attr = spec.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise WorkflowError(
                f"cannot import module {module_name!r} for {what} {spec!r}: {exc}"
            ) from exc
        cls = _attr(module, attr, spec)
    else:
        raise WorkflowError(
            f"{what} {spec!r} must look like 'module.Class' or 'path/file.py:Class'"
        )
    return cls


def make_workflow(spec: str | type | Any, kwargs: dict[str, Any] | None = None) -> Any:
    """An agent instance; an instance passed in is used as it is."""
    if not isinstance(spec, (str, type)):
        return _playable(spec, repr(spec))
    cls = load_workflow_class(spec)
    try:
        return cls(**(kwargs or {}))
    except TypeError as exc:
        raise WorkflowError(f"cannot build {cls.__name__}(**{kwargs}): {exc}") from exc


def import_file(path: str | Path) -> Any:
    """Import a Python file by path, once, under a stable module name (so that pickling
    in subproc mode finds its classes again)."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise WorkflowError(f"file {path} does not exist")
    # A stable, unique module name, so pickling (subproc mode) can find the class again.
    name = f"turnstile_workflow_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise WorkflowError(f"error while importing {file}: {exc}") from exc
    return module


def _attr(module: Any, attr: str, spec: str) -> Any:
    obj = getattr(module, attr, None)
    if obj is None:
        raise WorkflowError(f"{spec}: module has no attribute {attr!r}")
    return obj
