"""An answer's text -> reasoning, content and tool calls, incrementally: the reasoning
parser (if any) first, the tool-call parser (if any) on what is left of the answer.
"""

from __future__ import annotations

from gateway.chat.events import ContentEvent, Event, ToolCall
from gateway.chat.parsers import ReasoningParser, ToolParser


class OutputParser:
    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None) -> None:
        # a missing format: the base parsers, which pass all text on as content
        self.reasoning_parser = reasoning or ReasoningParser()
        self.tool_parser = tools or ToolParser()

    def feed(self, text: str) -> list[Event]:
        return self._tools(self.reasoning_parser.feed(text))

    def finish(self) -> list[Event]:
        return self._tools(self.reasoning_parser.finish()) + self.tool_parser.finish()

    def _tools(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            out += self.tool_parser.feed(event.text) if isinstance(event, ContentEvent) else [event]
        return out

    @property
    def content(self) -> str | None:
        return self.tool_parser.content

    @property
    def reasoning(self) -> str | None:
        return self.reasoning_parser.reasoning

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.tool_parser.tool_calls

    @property
    def failures(self) -> int:
        """Tool calls that did not parse (returned as content)."""
        return self.tool_parser.failures
