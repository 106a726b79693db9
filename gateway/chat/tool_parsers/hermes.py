"""Hermes / Qwen tool calls: JSON inside `<tool_call>...</tool_call>` tags.

- Hermes / Qwen: one JSON object `{"name": ..., "arguments": {...}}` per tag; several
  tags are parallel calls;
- SmolLM2: a JSON list of such objects inside one tag (`[]` means "no call").

This is also the form the gateway asks for when a model's own template knows no tools
(gateway/chat/tools.py). A block whose JSON does not parse comes back as plain content
and is counted in `failures`. Text outside the tags is content.
"""

from __future__ import annotations

import json

from gateway.chat.detokenize import partial_suffix_len
from gateway.chat.tool_parsers.base import (
    ContentEvent,
    Event,
    ToolCall,
    ToolCallEvent,
    ToolParser,
    new_call_id,
    register_tool_parser,
)

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def parse_block(body: str) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) of each call in one tag's body; None if it is not valid."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append((item["name"], json.dumps(args, ensure_ascii=False)))
    return calls


@register_tool_parser("hermes", detect=lambda template: TOOL_OPEN in template)
class HermesToolParser(ToolParser):
    """Feed text as it is generated; get content and complete tool calls back.

    Text that could be the start of a `<tool_call>` tag is held back until it is known,
    and a call is only reported once its closing tag (or the end of the answer) is seen.
    Whitespace between calls is not reported as content.
    """

    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._in_call = False
        self._held_ws = ""

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._buf += text
        while self._buf:
            if not self._in_call:
                start = self._buf.find(TOOL_OPEN)
                if start < 0:
                    ready = len(self._buf) - partial_suffix_len(self._buf, (TOOL_OPEN,))
                    self._content(self._buf[:ready], events)
                    self._buf = self._buf[ready:]
                    break
                self._content(self._buf[:start], events)
                self._buf = self._buf[start + len(TOOL_OPEN) :]
                self._in_call = True
            else:
                end = self._buf.find(TOOL_CLOSE)
                if end < 0:
                    break
                self._block(self._buf[:end], closed=True, events=events)
                self._buf = self._buf[end + len(TOOL_CLOSE) :]
                self._in_call = False
        return events

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._in_call:  # cut off, or the model forgot the closing tag
            self._block(self._buf, closed=False, events=events)
        else:
            self._content(self._buf, events)
        self._buf = ""
        if self._held_ws and not self.tool_calls:
            self._emit(self._held_ws, events)
        self._held_ws = ""
        return events

    def _block(self, body: str, closed: bool, events: list[Event]) -> None:
        calls = parse_block(body)
        if calls is None:
            self.failures += 1
            raw = TOOL_OPEN + body + (TOOL_CLOSE if closed else "")
            self._content(raw, events)
            return
        for name, arguments in calls:
            call = ToolCall(new_call_id(), name, arguments)
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
