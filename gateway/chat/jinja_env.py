"""Chat templates compiled as transformers compiles them (its sandboxed environment, options,
filters and globals: docs/architecture.md), on jinja2's public API only, so that the
gateway neither uses transformers' private compile function nor imports it
(tests/test_jinja_env.py holds each piece, and every family's render, to transformers').
Speed: the sandbox's verdict on an attribute depends only on (type, name), so it is kept
per pair, and a pair judged safe is read directly (never `format`/`format_map`).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


def raise_exception(message: str) -> None:
    raise TemplateError(message)


def tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
    sort_keys: bool = False,
) -> str:  # fmt: skip
    """Jinja's own `tojson` escapes HTML characters; chat templates want plain JSON."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class TemplateDict:
    """`dict(...)` in a template: builds a dict, and offers no attribute of `dict` itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(Namespace):
    """Jinja's `namespace`, refusing underscore names (no way to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (Namespace's own trick)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a "
                f"namespace, but got {name!r}. Please rename the attribute."
            )


class GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}`: marks an answer for transformers'
    assistant mask; when rendering, its body as is."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, with the sandbox's verdicts kept (above)."""

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols]
        )
        self.filters["tojson"] = tojson
        self.globals.update(
            raise_exception=raise_exception,
            strftime_now=strftime_now,
            dict=TemplateDict(),
            namespace=TemplateNamespace,
        )
        self._verdicts: dict[tuple[type, str], bool] = {}
        self._direct: set[tuple[type, str]] = set()  # judged safe, not str.format

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = bool(super().is_safe_attribute(obj, attr, value))
        return verdict

    def getattr(self, obj: Any, attribute: str) -> Any:
        key = (type(obj), attribute)
        if key in self._direct:
            try:
                return getattr(obj, attribute)
            except AttributeError:
                pass  # this object lacks it: the sandbox's way (an item, or undefined)
        value = super().getattr(obj, attribute)
        if attribute not in ("format", "format_map") and self._verdicts.get(key) is True:
            self._direct.add(key)
        return value


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> Any:
    """`source` compiled in its own environment (a `jinja2.Template`), once per text."""
    return ChatTemplateEnvironment().from_string(source)
