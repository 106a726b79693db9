"""The agent spec loader: a class, "module.Class", or "path/file.py:Class"."""

from __future__ import annotations

import sys
import textwrap

import pytest

from trainer.loading import WorkflowError, load_workflow_class, make_workflow


class InlineAgent:
    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    async def run(self, data, **extra_kwargs):  # type: ignore[no-untyped-def]
        return self.scale


def test_class_object() -> None:
    assert load_workflow_class(InlineAgent) is InlineAgent
    assert make_workflow(InlineAgent, {"scale": 2.0}).scale == 2.0


def test_module_dot_class(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_agents_mod.py").write_text(
        "class A:\n    async def run(self, data, **kw):\n        return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = load_workflow_class("my_agents_mod.A")
    assert cls.__name__ == "A"
    sys.modules.pop("my_agents_mod", None)


def test_file_path_colon_class(tmp_path) -> None:
    f = tmp_path / "agent_file.py"
    f.write_text(
        textwrap.dedent("""
        class FileAgent:
            def __init__(self, k=0):
                self.k = k
            async def run(self, data, **extra_kwargs):
                return float(self.k)
    """)
    )
    agent = make_workflow(f"{f}:FileAgent", {"k": 3})
    assert agent.k == 3
    # loading twice gives the same class (stable module name, needed for pickling)
    assert load_workflow_class(f"{f}:FileAgent") is type(agent)


def test_the_shipped_math_agent_loads() -> None:
    agent = make_workflow("agents/math_multi_turn.py:MathMultiTurnAgent", {"max_turns": 3})
    assert agent.max_turns == 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nodots", "module.Class"),
        ("no_such_module_xyz.Agent", "cannot import"),
        ("missing/file.py:Agent", "does not exist"),
        ("trainer.loading.WorkflowError", "async def run"),
        ("trainer.loading.NotThere", "no attribute"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(WorkflowError, match=message):
        load_workflow_class(spec)


def test_sync_run_is_rejected(tmp_path) -> None:
    f = tmp_path / "sync_agent.py"
    f.write_text("class S:\n    def run(self, data, **kw):\n        return 1.0\n")
    with pytest.raises(WorkflowError, match="async def run"):
        load_workflow_class(f"{f}:S")
