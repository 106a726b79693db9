"""Reasoning parsers by model family (see base.py); importing this registers them all."""

from gateway.chat.reasoning_parsers import (  # noqa: F401  (each registers its parsers)
    harmony,
    think,
)
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
