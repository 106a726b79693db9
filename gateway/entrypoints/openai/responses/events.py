"""The one choice of a response: its output items, and the event stream of a streamed
response (`response.created` ... `response.completed`).

The choice keeps the output items with their ids, so the `Response` recorded and
answered at the end names the same items the stream announced.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from gateway.chat.events import ToolCall
from gateway.chat.output_parser import OutputParser
from gateway.entrypoints.openai.responses.protocol import (
    call_item,
    message_item,
    reasoning_item,
    text_part,
)
from gateway.errors import APIError
from gateway.serving.endpoint import BlockChoice
from gateway.serving.turn import Answer
from gateway.sse import sse_event


class ResponseChoice(BlockChoice):
    """Frames numbered by `sequence_number`; reasoning is a reasoning item, text a message
    item, a tool call a function_call item."""

    def __init__(self, start: Any, parser: OutputParser | None = None, emit: bool = True) -> None:
        """`start`: the response as `response.created` announces it (in progress)."""
        super().__init__(parser, emit)
        self.start = start
        self.seq = 0
        self.item_id = ""  # the open item's
        # a client retry's replay: the recorded items' ids, for the items it opens again
        self.recorded_ids: Iterator[str] = iter(())

    def _frame(self, type: str, **fields: Any) -> bytes:
        if not self.emit:
            return b""
        event = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse_event(event, type)

    def _item(self, stage: str, item: Any) -> bytes:
        """`response.output_item.added` or `.done` for the item at the next index."""
        return self._frame(
            f"response.output_item.{stage}", output_index=len(self.blocks), item=item
        )

    def _in_item(self, type: str, **fields: Any) -> bytes:
        """An event inside the open item (at the next index)."""
        return self._frame(type, item_id=self.item_id, output_index=len(self.blocks), **fields)

    def start_frames(self) -> list[bytes]:
        return [
            self._frame("response.created", response=self.start),
            self._frame("response.in_progress", response=self.start),
        ]

    def empty(self) -> list[bytes]:
        return self.write("text", "")  # an empty answer is one empty message

    def _new_item(self, prefix: str) -> str:
        self.item_id = next(self.recorded_ids, None) or f"{prefix}_{uuid.uuid4().hex}"
        return self.item_id

    def opened(self, kind: str) -> list[bytes]:
        if kind == "reasoning":
            self._new_item("rs")
            return [self._item("added", reasoning_item("", self.item_id, done=False))]
        self._new_item("msg")
        return [
            self._item("added", message_item("", self.item_id, done=False)),
            self._in_item("response.content_part.added", content_index=0, part=text_part("")),
        ]

    def delta(self, kind: str, text: str) -> list[bytes]:
        if kind == "reasoning":
            return [self._in_item("response.reasoning_text.delta", content_index=0, delta=text)]
        return [
            self._in_item("response.output_text.delta", content_index=0, delta=text, logprobs=[])
        ]

    def closed(self, kind: str, text: str) -> tuple[Any, list[bytes]]:
        if kind == "reasoning":
            item: Any = reasoning_item(text, self.item_id)
            frames = [self._in_item("response.reasoning_text.done", content_index=0, text=text)]
        else:
            item = message_item(text, self.item_id)
            frames = [
                self._in_item("response.output_text.done", content_index=0, text=text, logprobs=[]),
                self._in_item("response.content_part.done", content_index=0, part=text_part(text)),
            ]
        return item, [*frames, self._item("done", item)]

    def tool_call(self, call: ToolCall) -> list[bytes]:
        self._new_item("fc")
        item = call_item(call, self.item_id)
        frames = [
            self._item("added", call_item(call, self.item_id, done=False)),
            self._in_item("response.function_call_arguments.delta", delta=call.arguments),
            self._in_item("response.function_call_arguments.done", arguments=call.arguments),
            self._item("done", item),
        ]
        self.blocks.append(item)
        return frames

    def done(self, answer: Answer) -> list[bytes]:
        response = answer.response  # (as recorded)
        done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return [self._frame(done, response=response)]

    def error(self, exc: APIError) -> bytes:
        return self._frame("error", code=exc.code, message=exc.message, param=exc.param)
