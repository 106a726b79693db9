"""The content blocks of one answer, and the event stream that announces them:
`message_start`, `ping`, then per block `content_block_start`, `content_block_delta`s
(`text_delta`, `thinking_delta`, `signature_delta`, `input_json_delta`) and
`content_block_stop`; then `message_delta` (stop reason, usage) and `message_stop`.

The writer keeps the finished blocks, so the `Message` recorded and answered at the end
holds what the stream announced; without a stream (`emit=False`) it only keeps them.
Every block opened is closed: Claude Code breaks on a missing `content_block_stop`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.chat.events import ContentEvent, Event, ReasoningEvent, ToolCall
from gateway.entrypoints.anthropic.errors import anthropic_error
from gateway.entrypoints.anthropic.messages.protocol import tool_use_block, tool_use_id
from gateway.errors import APIError
from gateway.sse import sse_event


class BlockWriter:
    def __init__(self, message_id: str, sign: Callable[[str], str], emit: bool = True) -> None:
        """`sign(thinking text)`: its signature (for this session, gateway/signing.py)."""
        self.message_id = message_id
        self.sign = sign
        self.emit = emit
        self.blocks: list[dict[str, Any]] = []  # finished content blocks
        self.tool_arguments: dict[str, str] = {}  # tool_use id -> the arguments generated
        self._open: dict[str, Any] | None = None  # the block being written
        self._parts: list[str] = []
        self._calls = 0

    def _frame(self, type: str, **fields: Any) -> bytes:
        return sse_event({"type": type, **fields}, type) if self.emit else b""

    def start(self, message: dict[str, Any]) -> list[bytes]:
        """`message_start` (with usage: the SDKs need it) and a first `ping`."""
        return [self._frame("message_start", message=message), self._frame("ping")]

    def events(self, events: list[Event]) -> list[bytes]:
        frames: list[bytes] = []
        for event in events:
            if isinstance(event, ContentEvent):
                frames += self.write("text", event.text)
            elif isinstance(event, ReasoningEvent):
                frames += self.write("thinking", event.text)
            else:
                frames += self.tool_use(event.call)
        return frames

    def write(self, kind: str, text: str) -> list[bytes]:
        """Text or thinking, into the open block of that kind (opened as needed)."""
        if not text:
            return []
        frames: list[bytes] = []
        if self._open is None or self._open["type"] != kind:
            frames += self.close()
            self._open = {"type": kind, kind: ""}  # text or thinking
            if kind == "thinking":
                self._open["signature"] = ""
            self._parts = []
            frames.append(
                self._frame("content_block_start", index=len(self.blocks), content_block=self._open)
            )
        self._parts.append(text)
        delta = {"type": f"{kind}_delta", kind: text}
        frames.append(self._frame("content_block_delta", index=len(self.blocks), delta=delta))
        return frames

    def close(self) -> list[bytes]:
        """Close the open block, if any (a thinking block gets its signature first)."""
        if self._open is None:
            return []
        index, text = len(self.blocks), "".join(self._parts)
        frames = []
        if self._open["type"] == "text":
            block: dict[str, Any] = {"type": "text", "text": text}
        else:
            signature = self.sign(text)
            block = {"type": "thinking", "thinking": text, "signature": signature}
            delta = {"type": "signature_delta", "signature": signature}
            frames.append(self._frame("content_block_delta", index=index, delta=delta))
        frames.append(self._frame("content_block_stop", index=index))
        self.blocks.append(block)
        self._open = None
        return frames

    def tool_use(self, call: ToolCall) -> list[bytes]:
        """A complete tool call: its block, its input in one `input_json_delta`."""
        frames = self.close()
        if not call.id.startswith("toolu_"):
            call.id = tool_use_id(self.message_id, self._calls)  # names this answer
        self._calls += 1
        index = len(self.blocks)
        block = tool_use_block(call)
        arguments = call.arguments or "{}"
        self.tool_arguments[call.id] = arguments
        frames += [
            self._frame("content_block_start", index=index, content_block={**block, "input": {}}),
            self._frame(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": arguments},
            ),
            self._frame("content_block_stop", index=index),
        ]
        self.blocks.append(block)
        return frames

    def finish(
        self, stop_reason: str, stop_sequence: str | None, usage: dict[str, int]
    ) -> list[bytes]:
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        return [
            self._frame("message_delta", delta=delta, usage=usage),
            self._frame("message_stop"),
        ]


def error_event(exc: APIError) -> bytes:
    """An error after the stream began, as Anthropic's SDKs read it."""
    return sse_event(anthropic_error(exc).body, "error")
