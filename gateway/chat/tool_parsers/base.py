"""What every tool-call parser shares: its events, and the registry parsers join.

A parser turns model text into content and tool calls, incrementally (fed as tokens
become text, for streaming), and counts the calls it could not parse instead of
dropping them. Add a model family's format as one module with
`@register_tool_parser("name")`; `detect_tool_parser` picks one from the chat template.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.registry import Registry


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class ContentEvent:
    text: str


@dataclass(slots=True)
class ToolCallEvent:
    index: int  # position among this answer's tool calls
    call: ToolCall


Event = ContentEvent | ToolCallEvent


def content_events(text: str) -> list[Event]:
    """Plain text as events (an answer nobody parses for tool calls)."""
    return [ContentEvent(text)] if text else []


class ToolParser(abc.ABC):
    """Feed text as it is generated; get content and complete tool calls back."""

    def __init__(self) -> None:
        self.content_parts: list[str] = []
        self.tool_calls: list[ToolCall] = []
        self.failures = 0  # calls that did not parse (returned as content, and counted)

    @property
    def content(self) -> str | None:
        text = "".join(self.content_parts)
        if self.tool_calls:
            return text.strip() or None
        return text

    @abc.abstractmethod
    def feed(self, text: str) -> list[Event]: ...

    @abc.abstractmethod
    def finish(self) -> list[Event]:
        """Events for what was held back, once the answer is complete."""


TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool parser")
# (name, does this chat template use the format?) in the order they are tried
_DETECTORS: list[tuple[str, Callable[[str], bool]]] = []


def register_tool_parser(
    name: str, detect: Callable[[str], bool] | None = None
) -> Callable[[type[ToolParser]], type[ToolParser]]:
    if detect is not None:
        _DETECTORS.append((name, detect))
    return TOOL_PARSERS.register(name)


def detect_tool_parser(chat_template: Any, default: str = "hermes") -> str:
    """The parser for the format this template teaches the model (else `default`)."""
    if isinstance(chat_template, str):
        for name, detect in _DETECTORS:
            if detect(chat_template):
                return name
    return default


def make_tool_parser(name: str) -> ToolParser:
    return TOOL_PARSERS.lookup(name)()
