"""What every output parser shares, and the two tables parsers are registered in.

A tool-call parser turns model text into content and tool calls; a reasoning parser
splits reasoning off the answer first. Both are fed text as it is generated, and count
the calls they could not parse instead of dropping them. The formats live with their
model family (gateway/chat/families/), registered here by name.
"""

from __future__ import annotations

import abc
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from gateway.chat.detokenize import partial_suffix_len
from gateway.chat.events import Event, ReasoningEvent, ToolCall, ToolCallEvent, content_events
from gateway.registry import Registry

Calls = list[tuple[str, str]]  # (name, arguments JSON) of each call


def scan(text: str, markers: tuple[str, ...]) -> tuple[str, str | None, str]:
    """(the text before the first of `markers`, that marker, the text after it); with
    none: (what cannot be the start of one, None, the rest, held back until known)."""
    hits = [(i, m) for m in markers if (i := text.find(m)) >= 0]
    if not hits:
        ready = len(text) - partial_suffix_len(text, markers)
        return text[:ready], None, text[ready:]
    at, marker = min(hits)
    return text[:at], marker, text[at + len(marker) :]


class TextParser:
    """Fed an answer's text as it is generated; gives events back. As it is, a parser
    of no format: all text is content (what OutputParser uses where there is none)."""

    def feed(self, text: str) -> list[Event]:
        return self._say(text)

    def finish(self) -> list[Event]:
        """Events for what was held back, once the answer is complete."""
        return []

    _say = staticmethod(content_events)


class ToolParser(TextParser):
    """Feed text as it is generated; get content and complete tool calls back."""

    # how one call is written, for the gateway's tool prompt (tools.py); None: Hermes'
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
        return "call_" + uuid.uuid4().hex[:24]

    def _say(self, text: str) -> list[Event]:
        if text:
            self.content_parts.append(text)
        return content_events(text)

    def _record(self, calls: Calls) -> list[Event]:
        events: list[Event] = []
        for name, arguments in calls:
            call = ToolCall(self.new_id(), name, arguments)
            events.append(ToolCallEvent(len(self.tool_calls), call))
            self.tool_calls.append(call)
        return events


def arguments_json(args: Any) -> str | None:
    """Tool arguments as a JSON object's text, else None. Missing or empty arguments are
    `{}` (a real call); an object double-encoded as a JSON string is decoded."""
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


def json_call(
    item: Any, keys: tuple[str, str] = ("arguments", "parameters")
) -> tuple[str, str] | None:
    """(name, arguments JSON) of a `{"name", keys[0] | keys[1]}` object, else None."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = arguments_json(item.get(keys[0], item.get(keys[1])))
    return None if arguments is None else (item["name"], arguments)


def each_match(
    pattern: re.Pattern[str], body: str, call: Callable[[re.Match[str]], Any]
) -> list[Any] | None:
    """`call(match)` of each match of `pattern`; None unless there is one, every one is
    a call, and the matches leave only whitespace of `body`."""
    calls = [call(m) for m in pattern.finditer(body)]
    if not calls or None in calls or pattern.sub("", body).strip():
        return None
    return calls


class BlockToolParser(ToolParser, abc.ABC):
    """Tool calls inside `open ... close` markers, the body parsed by `parse_block`, and
    reported once the block closes (or the answer ends). A block that does not parse
    comes back as content, markers included, and is counted; whitespace between calls
    is not content."""

    open: str
    close: str

    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._in_call = False
        self._held_ws = ""

    @abc.abstractmethod
    def parse_block(self, body: str) -> Calls | None:
        """The calls in one block; None if it does not parse (`[]`: a block that says
        "no call", as SmolLM2's `[]`)."""

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._buf += text
        while self._buf:
            if not self._in_call:
                before, opened, self._buf = scan(self._buf, (self.open,))
                events += self._content(before)
                if opened is None:
                    break
                self._in_call = True
            else:
                end = self._buf.find(self.close)
                if end < 0:
                    break
                events += self._block(self._buf[:end], closed=True)
                self._buf = self._buf[end + len(self.close) :]
                self._in_call = False
        return events

    def finish(self) -> list[Event]:
        text, self._buf = self._buf, ""
        # cut off, or the model forgot the closing marker
        events = self._block(text, closed=False) if self._in_call else self._content(text)
        if self._held_ws and not self.tool_calls:
            events += self._say(self._held_ws)
        self._held_ws = ""
        return events

    def _block(self, body: str, closed: bool) -> list[Event]:
        calls = self.parse_block(body)
        if calls is None:
            self.failures += 1
            return self._content(self.open + body + (self.close if closed else ""))
        return self._record(calls)

    def _content(self, text: str) -> list[Event]:
        """Trailing whitespace waits: it may be the gap before a tool call (dropped)."""
        if not text:
            return []
        text = self._held_ws + text
        body = text.rstrip()
        self._held_ws = text[len(body) :]
        return self._say(body)


class ReasoningParser(TextParser):
    """Feed text as it is generated; get `ReasoningEvent`s and `ContentEvent`s back.
    `prompt_text`, the rendered prompt, may have opened the reasoning block (DeepSeek-R1's
    ends with `<think>`): then the output starts inside it."""

    def __init__(self, prompt_text: str = "") -> None:
        self.reasoning_parts: list[str] = []

    @property
    def reasoning(self) -> str | None:
        return "".join(self.reasoning_parts) or None

    def _reason(self, text: str) -> list[Event]:
        if not text:
            return []
        self.reasoning_parts.append(text)
        return [ReasoningEvent(text)]


# by name (`--tool-parser`, `--reasoning-parser`, vLLM's names); filled by the families
TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool parser")
REASONING_PARSERS: Registry[type[ReasoningParser]] = Registry("reasoning parser")
