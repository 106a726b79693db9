"""What every output parser shares, and the two tables parsers are registered in.

A tool-call parser turns model text into content and tool calls; a reasoning parser
splits reasoning off the answer first. Both are fed text incrementally (as tokens
become text, for streaming) and count the calls they could not parse instead of
dropping them. The formats themselves live with their model family
(gateway/chat/families/), registered here by name: `@TOOL_PARSERS.register("name")`,
`@REASONING_PARSERS.register("name")`.
"""

from __future__ import annotations

import abc
import json
import uuid
from typing import Any

from gateway.chat.detokenize import partial_suffix_len
from gateway.chat.events import ContentEvent, Event, ReasoningEvent, ToolCall, ToolCallEvent
from gateway.registry import Registry


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ToolParser(abc.ABC):
    """Feed text as it is generated; get content and complete tool calls back."""

    # How one call is written, for the tool prompt the gateway adds when a template
    # shows no tools (gateway/chat/tools.py); None: the Hermes form.
    call_format: str | None = None

    def __init__(self) -> None:
        self.content_parts: list[str] = []
        self.tool_calls: list[ToolCall] = []
        self.failures = 0  # calls that did not parse (returned as content, and counted)

    @property
    def content(self) -> str | None:
        text = "".join(self.content_parts)
        if self.tool_calls:
            return text.strip() or None
        return text

    def new_id(self) -> str:
        """A new call's id (a family whose template checks ids overrides it)."""
        return new_call_id()

    @abc.abstractmethod
    def feed(self, text: str) -> list[Event]: ...

    @abc.abstractmethod
    def finish(self) -> list[Event]:
        """Events for what was held back, once the answer is complete."""


def arguments_json(args: Any) -> str | None:
    """Tool arguments as a JSON object's text (None when they are not an object).

    A call with no arguments is a real call: missing or empty arguments are `{}`. Some
    models double-encode the object as a JSON string; that is undone.
    """
    if args is None or args == "":
        return "{}"
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return json.dumps(args, ensure_ascii=False)


class BlockToolParser(ToolParser):
    """Tool calls inside `open ... close` markers, the body parsed by `parse_block`.

    Text that could be the start of the open marker is held back until it is known,
    and a block's calls are only reported once its close marker (or the end of the
    answer) is seen. A block that does not parse comes back as content, markers
    included, and is counted in `failures`. Whitespace between calls is not content.
    """

    open: str
    close: str

    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._in_call = False
        self._held_ws = ""

    @abc.abstractmethod
    def parse_block(self, body: str) -> list[tuple[str, str]] | None:
        """(name, arguments JSON) of each call in one block; None if it does not parse
        (`[]`: a block that says "no call", as SmolLM2's `[]`)."""

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._buf += text
        while self._buf:
            if not self._in_call:
                start = self._buf.find(self.open)
                if start < 0:
                    ready = len(self._buf) - partial_suffix_len(self._buf, (self.open,))
                    self._content(self._buf[:ready], events)
                    self._buf = self._buf[ready:]
                    break
                self._content(self._buf[:start], events)
                self._buf = self._buf[start + len(self.open) :]
                self._in_call = True
            else:
                end = self._buf.find(self.close)
                if end < 0:
                    break
                self._block(self._buf[:end], closed=True, events=events)
                self._buf = self._buf[end + len(self.close) :]
                self._in_call = False
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._in_call:  # cut off, or the model forgot the closing marker
            self._block(self._buf, closed=False, events=events)
        else:
            self._content(self._buf, events)
        self._buf = ""
        if self._held_ws and not self.tool_calls:
            self._emit(self._held_ws, events)
        self._held_ws = ""
        return events

    def _block(self, body: str, closed: bool, events: list[Event]) -> None:
        calls = self.parse_block(body)
        if calls is None:
            self.failures += 1
            self._content(self.open + body + (self.close if closed else ""), events)
            return
        for name, arguments in calls:
            call = ToolCall(self.new_id(), name, arguments)
            events.append(ToolCallEvent(len(self.tool_calls), call))
            self.tool_calls.append(call)

    def _content(self, text: str, events: list[Event]) -> None:
        """Trailing whitespace waits: it may be the gap before a tool call (dropped)."""
        if not text:
            return
        text = self._held_ws + text
        body = text.rstrip()
        self._held_ws = text[len(body) :]
        if body:
            self._emit(body, events)

    def _emit(self, text: str, events: list[Event]) -> None:
        self.content_parts.append(text)
        events.append(ContentEvent(text))


class ReasoningParser(abc.ABC):
    """Feed text as it is generated; get `ReasoningEvent`s and `ContentEvent`s back.

    `prompt_text` is the rendered prompt: a template may open the reasoning block
    itself (DeepSeek-R1's ends the prompt with `<think>`), and then the output starts
    inside it.
    """

    def __init__(self, prompt_text: str = "") -> None:
        self.reasoning_parts: list[str] = []

    @property
    def reasoning(self) -> str | None:
        return "".join(self.reasoning_parts) or None

    @abc.abstractmethod
    def feed(self, text: str) -> list[Event]: ...

    @abc.abstractmethod
    def finish(self) -> list[Event]:
        """Events for what was held back, once the answer is complete."""

    def _reason(self, text: str) -> list[Event]:
        if not text:
            return []
        self.reasoning_parts.append(text)
        return [ReasoningEvent(text)]

    @staticmethod
    def _say(text: str) -> list[Event]:
        return [ContentEvent(text)] if text else []


# by name (`--tool-parser`, `--reasoning-parser`, vLLM's names); filled by the families
TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool parser")
REASONING_PARSERS: Registry[type[ReasoningParser]] = Registry("reasoning parser")
