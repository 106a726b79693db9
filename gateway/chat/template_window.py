"""Which chat templates render each message on its own, so that a turn renders only its
new messages (docs/gateway.md, "Windowed renders"). Such a template's text is
`A + B(m_0) + ... + B(m_n) + C`, each `B(m_i)` depending only on `m_i`, `loop.first`,
`messages[0]` and settings fixed within a session, `A` and `C` only on `messages[0]` and
those settings. `message_local` proves it from the syntax tree (each rule below says
what it refuses), or says why not; tests/test_template_window.py checks full renders.
"""

from __future__ import annotations

from typing import Any

from jinja2 import nodes

# callables a message-local template may call: they return, or raise, nothing else
PURE_CALLS = frozenset({"raise_exception"})
_STATEFUL_FILTERS = frozenset({"random"})


def message_local(env: Any, source: str) -> str | None:
    """None when `source` is provably message-local (the module's rules), else why not."""
    tree = env.parse(source)
    loops = [n for n in tree.body if isinstance(n, nodes.For) and _is_name(n.iter, "messages")]
    if len(loops) != 1:
        return "not one top-level loop over messages"
    loop = loops[0]
    if loop.else_ or loop.test is not None or loop.recursive:
        return "the loop over messages has an else, a filter or recursion"
    if not isinstance(loop.target, nodes.Name):
        return "the loop over messages unpacks its items"
    macros = {m.name for m in tree.find_all(nodes.Macro)}
    return _Check(loop, macros).visit(tree, None, in_loop=False, nested=False)


def _is_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.name == name


class _Check:
    def __init__(self, loop: nodes.For, macros: set[str]) -> None:
        self.loop = loop
        self.macros = macros

    def visit(self, node: nodes.Node, parent: nodes.Node | None, *, in_loop: bool,
              nested: bool) -> str | None:  # fmt: skip
        """`in_loop`: inside the loop over messages; `nested`: inside another loop (where
        `loop` is that loop's)."""
        why = self._rule(node, parent, in_loop, nested)
        if why is not None:
            return why
        for child in node.iter_child_nodes():
            # in a loop's body (not its iterable or target), `loop` is that loop's
            body = (
                isinstance(node, nodes.For) and child is not node.iter and child is not node.target
            )
            if node is self.loop:
                why = self.visit(child, node, in_loop=body, nested=False)
            else:
                why = self.visit(child, node, in_loop=in_loop, nested=nested or body)
            if why is not None:
                return why
        return None

    def _rule(self, node: nodes.Node, parent: nodes.Node | None, in_loop: bool,
              nested: bool) -> str | None:  # fmt: skip
        if isinstance(node, nodes.Name):
            if node.name == "messages":
                if node.ctx != "load":
                    return "it assigns messages"
                first = (
                    isinstance(parent, nodes.Getitem)
                    and parent.node is node
                    and isinstance(parent.arg, nodes.Const)
                    and parent.arg.value == 0
                )
                if not first and node is not self.loop.iter:
                    return "it reads messages other than messages[0]"
            if node.name == "loop" and not nested:
                first = isinstance(parent, nodes.Getattr) and parent.attr == "first"
                if not (in_loop and first):
                    return "it reads the loop's position other than loop.first"
        elif isinstance(node, nodes.NSRef):
            return "it assigns a namespace attribute (state carried between messages)"
        elif in_loop and isinstance(node, (nodes.Assign, nodes.AssignBlock, nodes.ExprStmt)):
            return "it assigns inside the loop over messages"
        elif in_loop and isinstance(node, (nodes.Macro, nodes.CallBlock, nodes.Include,
                                           nodes.Import, nodes.FromImport, nodes.Extends,
                                           nodes.Block)):  # fmt: skip
            return "it defines, includes or extends inside the loop over messages"
        elif in_loop and not nested and isinstance(node, nodes.Break):
            return "it breaks out of the loop over messages"
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name):
            if node.node.name not in PURE_CALLS and node.node.name not in self.macros:
                return f"it calls {node.node.name}(), which may not give the same text twice"
        elif isinstance(node, nodes.Filter) and node.name in _STATEFUL_FILTERS:
            return f"it uses the {node.name} filter"
        return None
