"""What every reasoning parser shares, and the registry parsers join.

A reasoning parser splits model text into reasoning and the answer, incrementally (for
streaming). It runs before the tool-call parser: only the answer is searched for tool
calls. Add a format as one module with `@register_reasoning_parser("name", detect=...)`;
`detect_reasoning_parser` picks one from the chat template.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from gateway.chat.tool_parsers.base import ContentEvent, Event, ReasoningEvent
from gateway.registry import Registry


class ReasoningParser(abc.ABC):
    """Feed text as it is generated; get `ReasoningEvent`s and `ContentEvent`s back.

    `prompt_text` is the rendered prompt: a template may open the reasoning block
    itself (DeepSeek-R1's ends the prompt with `<think>`), and then the output starts
    inside it.
    """

    def __init__(self, prompt_text: str = "") -> None:
        self.reasoning_parts: list[str] = []

    @property
    def reasoning(self) -> str | None:
        return "".join(self.reasoning_parts) or None

    @abc.abstractmethod
    def feed(self, text: str) -> list[Event]: ...

    @abc.abstractmethod
    def finish(self) -> list[Event]:
        """Events for what was held back, once the answer is complete."""

    def _reason(self, text: str) -> list[Event]:
        if not text:
            return []
        self.reasoning_parts.append(text)
        return [ReasoningEvent(text)]

    @staticmethod
    def _say(text: str) -> list[Event]:
        return [ContentEvent(text)] if text else []


REASONING_PARSERS: Registry[type[ReasoningParser]] = Registry("reasoning parser")
_DETECTORS: list[tuple[str, Callable[[str], bool]]] = []


def register_reasoning_parser(
    name: str, detect: Callable[[str], bool] | None = None
) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    if detect is not None:
        _DETECTORS.append((name, detect))
    return REASONING_PARSERS.register(name)


def detect_reasoning_parser(chat_template: Any) -> str | None:
    """The parser for the reasoning format this template shows (None: it shows none)."""
    if isinstance(chat_template, str):
        for name, detect in _DETECTORS:
            if detect(chat_template):
                return name
    return None


def make_reasoning_parser(name: str, prompt_text: str = "") -> ReasoningParser:
    return REASONING_PARSERS.lookup(name)(prompt_text)
