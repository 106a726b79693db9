"""The event stream of a streamed response (`response.created` ... `response.completed`).

The writer also keeps the output items with their ids, so the `Response` recorded and
answered at the end names the same items the stream announced.
"""

from __future__ import annotations

import uuid
from typing import Any

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from gateway.chat.events import ContentEvent, Event, ReasoningEvent, ToolCall
from gateway.entrypoints.openai.responses.protocol import (
    call_item,
    dump,
    message_item,
    reasoning_item,
    text_part,
)
from gateway.errors import APIError
from gateway.sse import sse_event

# Each event type with the openai class that shapes it.
EVENTS: dict[str, Any] = {
    "response.created": ResponseCreatedEvent,
    "response.in_progress": ResponseInProgressEvent,
    "response.output_item.added": ResponseOutputItemAddedEvent,
    "response.output_item.done": ResponseOutputItemDoneEvent,
    "response.content_part.added": ResponseContentPartAddedEvent,
    "response.content_part.done": ResponseContentPartDoneEvent,
    "response.output_text.delta": ResponseTextDeltaEvent,
    "response.output_text.done": ResponseTextDoneEvent,
    "response.reasoning_text.delta": ResponseReasoningTextDeltaEvent,
    "response.reasoning_text.done": ResponseReasoningTextDoneEvent,
    "response.function_call_arguments.delta": ResponseFunctionCallArgumentsDeltaEvent,
    "response.function_call_arguments.done": ResponseFunctionCallArgumentsDoneEvent,
    "response.completed": ResponseCompletedEvent,
    "response.incomplete": ResponseIncompleteEvent,
    "error": ResponseErrorEvent,
}


class EventWriter:
    """The SSE frames of one streamed response, numbered by `sequence_number`.

    Output items are opened and closed as parsed events come: reasoning opens (or
    continues) a reasoning item, text a message item; either closes the other, and a
    tool call closes both and adds a complete function_call item.
    """

    def __init__(self, emit: bool = True) -> None:
        self.emit = emit  # False: only keep track of the output items (no stream)
        self.seq = 0
        self.items: list[Any] = []  # finished output items
        self._msg_id: str | None = None
        self._text: list[str] = []
        self._rs_id: str | None = None
        self._reasoning: list[str] = []

    @property
    def open(self) -> bool:
        """Is an item open (text may still come)?"""
        return self._msg_id is not None or self._rs_id is not None

    def _frame(self, type: str, **fields: Any) -> bytes:
        if not self.emit:
            return b""
        event = EVENTS[type].model_construct(sequence_number=self.seq, type=type, **fields)
        self.seq += 1
        return sse_event(dump(event), type)

    def _item(self, stage: str, item: Any) -> bytes:
        """`response.output_item.added` or `.done` for the item at the next index."""
        return self._frame(f"response.output_item.{stage}", output_index=len(self.items), item=item)

    def _in_item(self, type: str, item_id: str, **fields: Any) -> bytes:
        """An event inside the item at the next index."""
        return self._frame(type, item_id=item_id, output_index=len(self.items), **fields)

    def start(self, response: Response) -> list[bytes]:
        return [
            self._frame("response.created", response=response),
            self._frame("response.in_progress", response=response),
        ]

    def events(self, events: list[Event]) -> list[bytes]:
        frames: list[bytes] = []
        for event in events:
            if isinstance(event, ContentEvent):
                frames += self.text(event.text)
            elif isinstance(event, ReasoningEvent):
                frames += self.reasoning(event.text)
            else:
                frames += self.call(event.call)
        return frames

    def reasoning(self, text: str) -> list[bytes]:
        frames = self._close_message()
        if self._rs_id is None:
            self._rs_id = f"rs_{uuid.uuid4().hex}"
            self._reasoning = []
            frames.append(self._item("added", reasoning_item("", self._rs_id, done=False)))
        if text:
            self._reasoning.append(text)
            frames.append(
                self._in_item(
                    "response.reasoning_text.delta", self._rs_id, content_index=0, delta=text
                )
            )
        return frames

    def _close_reasoning(self) -> list[bytes]:
        if self._rs_id is None:
            return []
        text, item_id = "".join(self._reasoning), self._rs_id
        item = reasoning_item(text, item_id)
        frames = [
            self._in_item("response.reasoning_text.done", item_id, content_index=0, text=text),
            self._item("done", item),
        ]
        self.items.append(item)
        self._rs_id = None
        return frames

    def text(self, text: str) -> list[bytes]:
        frames = self._close_reasoning()
        if self._msg_id is None:
            frames += self._open_message()
        if text:
            self._text.append(text)
            frames.append(
                self._in_item(
                    "response.output_text.delta",
                    self._msg_id,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return frames

    def _open_message(self) -> list[bytes]:
        self._msg_id = f"msg_{uuid.uuid4().hex}"
        self._text = []
        return [
            self._item("added", message_item("", self._msg_id, done=False)),
            self._in_item(
                "response.content_part.added", self._msg_id, content_index=0, part=text_part("")
            ),
        ]

    def close(self) -> list[bytes]:
        """Close the open item, if any."""
        return self._close_reasoning() + self._close_message()

    def _close_message(self) -> list[bytes]:
        if self._msg_id is None:
            return []
        text, item_id = "".join(self._text), self._msg_id
        item = message_item(text, item_id)
        frames = [
            self._in_item(
                "response.output_text.done", item_id, content_index=0, text=text, logprobs=[]
            ),
            self._in_item(
                "response.content_part.done", item_id, content_index=0, part=text_part(text)
            ),
            self._item("done", item),
        ]
        self.items.append(item)
        self._msg_id = None
        return frames

    def call(self, call: ToolCall, item_id: str | None = None) -> list[bytes]:
        frames = self.close()
        item_id = item_id or f"fc_{uuid.uuid4().hex}"
        item = call_item(call, item_id)
        frames += [
            self._item("added", call_item(call, item_id, done=False)),
            self._in_item("response.function_call_arguments.delta", item_id, delta=call.arguments),
            self._in_item(
                "response.function_call_arguments.done", item_id, arguments=call.arguments
            ),
            self._item("done", item),
        ]
        self.items.append(item)
        return frames

    def finish(self, response: Response) -> bytes:
        done = "response.incomplete" if response.status == "incomplete" else "response.completed"
        return self._frame(done, response=response)

    def error(self, exc: APIError) -> bytes:
        return self._frame("error", code=exc.code, message=exc.message, param=exc.param)
