"""Tool-call parsers by model family (see base.py); importing this registers them all."""

from gateway.chat.tool_parsers import (  # noqa: F401  (each registers its parser)
    deepseek_v3,
    harmony,
    hermes,
    llama3_json,
    qwen3_coder,
)
from gateway.chat.tool_parsers.base import (
    TOOL_PARSERS,
    ContentEvent,
    Event,
    ReasoningEvent,
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
    "ReasoningEvent",
    "ToolCall",
    "ToolCallEvent",
    "ToolParser",
    "content_events",
    "detect_tool_parser",
    "make_tool_parser",
    "register_tool_parser",
]
