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
    if isinstance(spec, type):
        cls = spec
    elif not isinstance(spec, str) or not spec:
        raise WorkflowError(f"workflow must be a class or a string, got {spec!r}")
    elif ":" in spec and (spec.split(":", 1)[0].endswith(".py") or "/" in spec):
        cls = _from_file(*spec.rsplit(":", 1))
    elif "." in spec:
        module_name, _, attr = spec.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise WorkflowError(
                f"cannot import module {module_name!r} for workflow {spec!r}: {exc}"
            ) from exc
        cls = _attr(module, attr, spec)
    else:
        raise WorkflowError(
            f"workflow {spec!r} must look like 'module.Class' or 'path/file.py:Class'"
        )
    run = getattr(cls, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise WorkflowError(f"{cls.__name__} needs `async def run(self, data, **extra_kwargs)`")
    return cls


def make_workflow(spec: str | type | Any, kwargs: dict[str, Any] | None = None) -> Any:
    """An agent instance; an instance passed in is used as it is."""
    if not isinstance(spec, (str, type)):
        if not inspect.iscoroutinefunction(getattr(spec, "run", None)):
            raise WorkflowError(f"{spec!r} has no `async def run(self, data, **extra_kwargs)`")
        return spec
    cls = load_workflow_class(spec)
    try:
        return cls(**(kwargs or {}))
    except TypeError as exc:
        raise WorkflowError(f"cannot build {cls.__name__}(**{kwargs}): {exc}") from exc


def _from_file(path: str, attr: str) -> type:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise WorkflowError(f"workflow file {path} does not exist")
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
    return _attr(module, attr, f"{path}:{attr}")


def _attr(module: Any, attr: str, spec: str) -> type:
    cls = getattr(module, attr, None)
    if cls is None:
        raise WorkflowError(f"{spec}: module has no attribute {attr!r}")
    if not isinstance(cls, type):
        raise WorkflowError(f"{spec} is not a class")
    return cls
