"""Tool-call parsers by model family (see base.py); importing this registers them all."""

from gateway.chat.tool_parsers import hermes  # noqa: F401  (registers "hermes")
from gateway.chat.tool_parsers.base import (
    TOOL_PARSERS,
    ContentEvent,
    Event,
    ToolCall,
    ToolCallEvent,
    ToolParser,
    content_events,
    detect_tool_parser,
    make_tool_parser,
    register_tool_parser,
)

__all__ = [
    "TOOL_PARSERS",
    "ContentEvent",
    "Event",
    "ToolCall",
    "ToolCallEvent",
    "ToolParser",
    "content_events",
    "detect_tool_parser",
    "make_tool_parser",
    "register_tool_parser",
]
