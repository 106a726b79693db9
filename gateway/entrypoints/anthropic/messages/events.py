"""The one choice of a message: its content blocks, and the event stream that announces
them (docs/gateway.md, "Anthropic Messages API", **Streaming**). It keeps the finished
blocks, so the `Message` recorded and answered holds what the stream announced; every
block opened is closed (Claude Code breaks on a missing `content_block_stop`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.chat.events import ToolCall
from gateway.chat.output_parser import OutputParser
from gateway.entrypoints.anthropic.errors import anthropic_error
from gateway.entrypoints.anthropic.messages.protocol import tool_use_block, tool_use_id
from gateway.errors import APIError
from gateway.serving.endpoint import BlockChoice
from gateway.serving.turn import Answer
from gateway.sse import sse_event


class MessageChoice(BlockChoice):
    REASONING = "thinking"

    def __init__(
        self,
        start: dict[str, Any],
        sign: Callable[[str], str],
        parser: OutputParser | None = None,
        emit: bool = True,
    ) -> None:
        """`start`: the message as `message_start` announces it (its id names the tool
        calls); `sign(thinking text)`: its signature (for this session, gateway/signing.py)."""
        super().__init__(parser, emit)
        self.start, self.sign = start, sign
        self.tool_arguments: dict[str, str] = {}  # tool_use id -> the arguments generated

    def _frame(self, type: str, **fields: Any) -> bytes:
        return sse_event({"type": type, **fields}, type) if self.emit else b""

    def start_frames(self) -> list[bytes]:
        """`message_start` (with usage: the SDKs need it) and a first `ping`."""
        return [self._frame("message_start", message=self.start), self._frame("ping")]

    def opened(self, kind: str) -> list[bytes]:
        block = {"type": kind, kind: ""}  # text or thinking
        if kind == "thinking":
            block["signature"] = ""
        return [self._frame("content_block_start", index=len(self.blocks), content_block=block)]

    def delta(self, kind: str, text: str) -> list[bytes]:
        delta = {"type": f"{kind}_delta", kind: text}
        return [self._frame("content_block_delta", index=len(self.blocks), delta=delta)]

    def closed(self, kind: str, text: str) -> tuple[Any, list[bytes]]:
        """The block (a thinking block gets its signature first)."""
        index, frames = len(self.blocks), []
        block: dict[str, Any] = {"type": kind, kind: text}
        if kind == "thinking":
            block["signature"] = signature = self.sign(text)
            delta = {"type": "signature_delta", "signature": signature}
            frames.append(self._frame("content_block_delta", index=index, delta=delta))
        frames.append(self._frame("content_block_stop", index=index))
        return block, frames

    def tool_call(self, call: ToolCall) -> list[bytes]:
        """Its block, its input in one `input_json_delta`."""
        if not call.id.startswith("toolu_"):  # names this answer
            call.id = tool_use_id(self.start["id"], len(self.tool_arguments))
        index = len(self.blocks)
        block = tool_use_block(call)
        arguments = self.tool_arguments[call.id] = call.arguments or "{}"
        self.blocks.append(block)
        delta = {"type": "input_json_delta", "partial_json": arguments}
        return [
            self._frame("content_block_start", index=index, content_block={**block, "input": {}}),
            self._frame("content_block_delta", index=index, delta=delta),
            self._frame("content_block_stop", index=index),
        ]

    def done(self, answer: Answer) -> list[bytes]:
        m = answer.response["message"]
        delta = {"stop_reason": m["stop_reason"], "stop_sequence": m["stop_sequence"]}
        return [
            self._frame("message_delta", delta=delta, usage=m["usage"]),
            self._frame("message_stop"),
        ]


def error_event(exc: APIError) -> bytes:
    """An error after the stream began, as Anthropic's SDKs read it."""
    return sse_event(anthropic_error(exc).body, "error")
