"""Model families, one file each: how to tell a family's chat template, its template
quirks, its renderer when it is not Jinja, and its tool-call and reasoning parsers.

A family file registers its parsers (gateway/chat/parsers.py) and one `Family`; every
module here is imported, so adding a family is adding its file. Detection reads the
template's text, specific families by name first, then generic ones (Hermes' tags also
appear in Qwen3-Coder's templates); tool and reasoning formats are detected apart, since
templates mix them (Qwen3-Coder's XML calls with Qwen3's `<think>`).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.chat.parsers import REASONING_PARSERS, TOOL_PARSERS, ReasoningParser, ToolParser
from gateway.chat.template_traits import TemplateTraits
from gateway.registry import Registry

Message = dict[str, Any]


class OwnTemplate(Protocol):
    """A family's prompt renderer that is not a Jinja template (gpt-oss's harmony)."""

    traits: TemplateTraits  # what it expects of the normalised messages

    def render(self, messages: list[Message], tools: list[Message] | None) -> str: ...

    def standalone(self, messages: list[Message]) -> list[Message]:
        """The messages made to render the same with an earlier answer replaced (as
        token-exact history renders the text after an answer)."""


@dataclass(frozen=True, slots=True)
class Family:
    """What the gateway knows of one model family; every field but `name` is optional."""

    name: str
    tool_parser: str | None = None  # the TOOL_PARSERS name of the calls its templates teach
    reasoning_parser: str | None = None  # the REASONING_PARSERS name of its reasoning
    teaches_tools: Callable[[str], bool] | None = None  # template text -> uses `tool_parser`
    shows_reasoning: Callable[[str], bool] | None = None  # -> uses `reasoning_parser`
    generic: bool = False  # its detectors are tried after every specific family's
    stop_tokens: tuple[str, ...] = ()  # its turn enders: stop ids where a tokenizer has them
    reasoning_block: re.Pattern[str] | None = None  # reasoning in the text (drift.py)
    shape_message: Callable[[Message], Message] | None = None  # its quirk, as a new dict
    renderer: Callable[[Any], OwnTemplate] | None = None  # tokenizer -> its own renderer
    renderer_name: str | None = None  # `--chat-template NAME` picks `renderer`
    renders_tokenizer: Callable[[Any], bool] | None = None  # a template-less tokenizer it serves


FAMILIES: Registry[Family] = Registry("model family", "model families")


def register_family(family: Family) -> Family:
    """Add a family (its module's last line); a name taken twice is an error."""
    return FAMILIES.add(family.name, family)


def ordered() -> list[Family]:
    """Families in detection order: specific ones by name, then generic ones."""
    return sorted(FAMILIES.values(), key=lambda f: (f.generic, f.name))


def _detected(chat_template: Any, test: str, generic: bool | None = None) -> Family | None:
    """The first family (in `ordered()`, of `generic` kind if given) whose detector
    `test` ("teaches_tools" or "shows_reasoning") accepts the template's text."""
    if isinstance(chat_template, str):
        for family in ordered():
            detect = getattr(family, test)
            if generic in (None, family.generic) and detect and detect(chat_template):
                return family
    return None


def family_of(chat_template: Any) -> Family | None:
    """The family the template is of: the first whose tool-call format, else reasoning
    format, it shows (a specific family before a generic one)."""
    found = (
        _detected(chat_template, test, generic)
        for generic in (False, True)
        for test in ("teaches_tools", "shows_reasoning")
    )
    return next(filter(None, found), None)


def detect_tool_parser(chat_template: Any, default: str) -> str:
    """The parser for the call format this template teaches the model (else `default`)."""
    family = _detected(chat_template, "teaches_tools")
    return (family and family.tool_parser) or default


def detect_reasoning_parser(chat_template: Any) -> str | None:
    """The parser for the reasoning format this template shows (None: it shows none)."""
    family = _detected(chat_template, "shows_reasoning")
    return family.reasoning_parser if family else None


def by_renderer(name: str | None) -> Family | None:
    """The family whose own renderer `name` (a `--chat-template` value) names."""
    return next((f for f in ordered() if name and f.renderer_name == name), None)


def renderer_for(tokenizer: Any) -> str | None:
    """The own renderer's name for a tokenizer that ships no chat template."""
    serves = (f for f in ordered() if f.renders_tokenizer and f.renders_tokenizer(tokenizer))
    return next((f.renderer_name for f in serves), None)


def stop_tokens() -> set[str]:
    """Every family's turn enders (a tokenizer's that it has are stop ids)."""
    return {t for family in FAMILIES.values() for t in family.stop_tokens}


def make_tool_parser(name: str) -> ToolParser:
    return TOOL_PARSERS.lookup(name)()


def make_reasoning_parser(name: str, prompt_text: str = "") -> ReasoningParser:
    return REASONING_PARSERS.lookup(name)(prompt_text)


for _module in pkgutil.iter_modules(__path__):  # each family registers itself
    importlib.import_module(f"{__name__}.{_module.name}")
