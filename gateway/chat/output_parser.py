"""An answer's text -> reasoning, content and tool calls, incrementally: the reasoning
parser (if any) first, the tool-call parser (if any) on what is left of the answer.
"""

from __future__ import annotations

from gateway.chat.events import ContentEvent, Event, ToolCall, content_events
from gateway.chat.parsers import ReasoningParser, ToolParser


class OutputParser:
    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None) -> None:
        self.reasoning_parser = reasoning
        self.tool_parser = tools
        self._content: list[str] = []  # when there is no tool parser

    def feed(self, text: str) -> list[Event]:
        events = self.reasoning_parser.feed(text) if self.reasoning_parser else content_events(text)
        return self._tools(events)

    def finish(self) -> list[Event]:
        events = self._tools(self.reasoning_parser.finish()) if self.reasoning_parser else []
        if self.tool_parser is not None:
            events += self.tool_parser.finish()
        return events

    def _tools(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            if not isinstance(event, ContentEvent):
                out.append(event)
            elif self.tool_parser is not None:
                out += self.tool_parser.feed(event.text)
            else:
                self._content.append(event.text)
                out.append(event)
        return out

    @property
    def content(self) -> str | None:
        if self.tool_parser is not None:
            return self.tool_parser.content
        return "".join(self._content)

    @property
    def reasoning(self) -> str | None:
        return self.reasoning_parser.reasoning if self.reasoning_parser else None

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.tool_parser.tool_calls if self.tool_parser else []

    @property
    def failures(self) -> int:
        """Tool calls that did not parse (returned as content)."""
        return self.tool_parser.failures if self.tool_parser else 0
