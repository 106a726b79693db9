"""Reasoning parsers by model family (see base.py); importing this registers them all."""

from gateway.chat.reasoning_parsers import think  # noqa: F401  (registers qwen3, deepseek_r1)
from gateway.chat.reasoning_parsers.base import (
    REASONING_PARSERS,
    ReasoningParser,
    detect_reasoning_parser,
    make_reasoning_parser,
    register_reasoning_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "ReasoningParser",
    "detect_reasoning_parser",
    "make_reasoning_parser",
    "register_reasoning_parser",
]
