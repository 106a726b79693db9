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
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from gateway.chat.tool_parsers import ContentEvent, Event, ToolCall
from gateway.entrypoints.openai.responses.protocol import call_item, dump, message_item, text_part
from gateway.errors import APIError
from gateway.sse import sse_event


class EventWriter:
    """The SSE frames of one streamed response, numbered by `sequence_number`.

    Output items are opened and closed as parsed events come: text opens (or continues)
    a message item, a tool call closes it and adds a complete function_call item.
    """

    def __init__(self, emit: bool = True) -> None:
        self.emit = emit  # False: only keep track of the output items (no stream)
        self.seq = 0
        self.items: list[Any] = []  # finished output items
        self._msg_id: str | None = None
        self._text: list[str] = []

    @property
    def open(self) -> bool:
        """Is a message item open (text may still come)?"""
        return self._msg_id is not None

    def _frame(self, cls: Any, **fields: Any) -> bytes:
        if not self.emit:
            return b""
        event = cls.model_construct(sequence_number=self.seq, **fields)
        self.seq += 1
        return sse_event(dump(event), fields["type"])

    def start(self, response: Response) -> list[bytes]:
        return [
            self._frame(ResponseCreatedEvent, type="response.created", response=response),
            self._frame(ResponseInProgressEvent, type="response.in_progress", response=response),
        ]

    def events(self, events: list[Event]) -> list[bytes]:
        frames: list[bytes] = []
        for event in events:
            if isinstance(event, ContentEvent):
                frames += self.text(event.text)
            else:
                frames += self.call(event.call)
        return frames

    def text(self, text: str) -> list[bytes]:
        frames = [] if self._msg_id is not None else self._open_message()
        if text:
            self._text.append(text)
            frames.append(
                self._frame(
                    ResponseTextDeltaEvent,
                    type="response.output_text.delta",
                    item_id=self._msg_id,
                    output_index=len(self.items),
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return frames

    def _open_message(self) -> list[bytes]:
        self._msg_id = f"msg_{uuid.uuid4().hex}"
        self._text = []
        index = len(self.items)
        return [
            self._frame(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=index,
                item=message_item("", self._msg_id, done=False),
            ),
            self._frame(
                ResponseContentPartAddedEvent,
                type="response.content_part.added",
                item_id=self._msg_id,
                output_index=index,
                content_index=0,
                part=text_part(""),
            ),
        ]

    def close(self) -> list[bytes]:
        """Close the open message item, if any."""
        if self._msg_id is None:
            return []
        text, item_id, index = "".join(self._text), self._msg_id, len(self.items)
        item = message_item(text, item_id)
        frames = [
            self._frame(
                ResponseTextDoneEvent,
                type="response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._frame(
                ResponseContentPartDoneEvent,
                type="response.content_part.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=text_part(text),
            ),
            self._frame(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=index,
                item=item,
            ),
        ]
        self.items.append(item)
        self._msg_id = None
        return frames

    def call(self, call: ToolCall, item_id: str | None = None) -> list[bytes]:
        frames = self.close()
        item_id = item_id or f"fc_{uuid.uuid4().hex}"
        index = len(self.items)
        item = call_item(call, item_id)
        frames += [
            self._frame(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=index,
                item=call_item(call, item_id, done=False),
            ),
            self._frame(
                ResponseFunctionCallArgumentsDeltaEvent,
                type="response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            ),
            self._frame(
                ResponseFunctionCallArgumentsDoneEvent,
                type="response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=call.arguments,
            ),
            self._frame(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=index,
                item=item,
            ),
        ]
        self.items.append(item)
        return frames

    def finish(self, response: Response) -> bytes:
        if response.status == "incomplete":
            return self._frame(
                ResponseIncompleteEvent, type="response.incomplete", response=response
            )
        return self._frame(ResponseCompletedEvent, type="response.completed", response=response)

    def error(self, exc: APIError) -> bytes:
        return self._frame(
            ResponseErrorEvent, type="error", code=exc.code, message=exc.message, param=exc.param
        )
