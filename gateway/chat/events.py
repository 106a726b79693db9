"""What the output parsers make of an answer's text: content, reasoning and tool calls,
which each endpoint turns into its own wire shapes, whatever the model family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
class ReasoningEvent:
    """Text of the model's reasoning (a `<think>` block, harmony's analysis channel)."""

    text: str


@dataclass(slots=True)
class ToolCallEvent:
    index: int  # position among this answer's tool calls
    call: ToolCall


Event = ContentEvent | ReasoningEvent | ToolCallEvent


def content_events(text: str) -> list[Event]:
    """Plain text as events (an answer nobody parses for tool calls)."""
    return [ContentEvent(text)] if text else []
