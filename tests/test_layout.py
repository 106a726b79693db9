"""Rules of the code's shape that hold from now on (issue 32).

No function in gateway/ or trainer/ takes more than 6 parameters besides self/cls:
parameters that travel together are one named frozen dataclass, or the config object
that already holds them. A FastAPI route's query is a query-parameter model.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "trainer")
MAX_PARAMETERS = 6

Function = ast.FunctionDef | ast.AsyncFunctionDef


def parameter_count(fn: Function) -> int:
    """Every parameter a caller can pass (positional-only, ordinary, keyword-only,
    *args, **kwargs), the leading self/cls left out."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    leading = 1 if names and names[0] in ("self", "cls") else 0
    starred = (a.vararg is not None) + (a.kwarg is not None)
    return len(names) - leading + len(a.kwonlyargs) + starred


def too_long(source: str, where: str) -> list[str]:
    """`where:line name count` of each function (nested ones too) over the limit."""
    return [
        f"{where}:{node.lineno} {node.name} takes {parameter_count(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, Function) and parameter_count(node) > MAX_PARAMETERS
    ]


def test_the_counter_sees_every_kind_of_parameter() -> None:
    source = """
class C:
    def method(self, a, b, c, d, e, f): ...
    @classmethod
    def build(cls, a, /, b, *, c, d, e, f, g): ...
async def outer(a, b, *args, c, **kwargs):
    def inner(a, b, c, d, e, f, g): ...
"""
    assert too_long(source, "x.py") == [
        "x.py:5 build takes 7",
        "x.py:7 inner takes 7",
    ]


def test_no_function_takes_more_than_six_parameters() -> None:
    offenders = [
        hit
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for hit in too_long(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not offenders, (
        f"more than {MAX_PARAMETERS} parameters (group those that travel together in a "
        "frozen dataclass, or pass the config that holds them):\n" + "\n".join(offenders)
    )
