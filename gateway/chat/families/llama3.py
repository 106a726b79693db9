"""Llama 3.1 JSON tool calls: the whole answer is `{"name": ..., "parameters": {...}}`,
maybe after `<|python_tag|>`; parallel calls follow each other, split by `;` or space.

Its npm-package template has no tools: the gateway ships one (`--chat-template
llama3_1_json`). An answer that starts otherwise streams as content; one that starts
like a call is held to its end, then parsed (returned as content, counted, if invalid).
"""

from __future__ import annotations

import json

from gateway.chat.events import Event
from gateway.chat.families import Family, register_family
from gateway.chat.parsers import TOOL_PARSERS, Calls, ToolParser, json_call

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


def parse_calls(text: str) -> Calls | None:
    """Each call object in `text`; None if any is not valid."""
    text = text.strip().removeprefix(PYTHON_TAG)
    calls, pos = [], 0
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
        if pos == len(text):
            return calls or None
        try:
            item, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        call = json_call(item, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)


@TOOL_PARSERS.register("llama3_json")
class Llama3JsonToolParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self._buf = ""
        self._mode: str | None = None  # None: undecided; "content" or "calls"

    def feed(self, text: str) -> list[Event]:
        if self._mode == "content":
            return self._say(text)
        self._buf += text
        head = self._buf.lstrip()
        if self._mode is None and head and not PYTHON_TAG.startswith(head):
            self._mode = "calls" if head.startswith(("{", PYTHON_TAG)) else "content"
        if self._mode != "content":
            return []  # a call, held to the end, or what could still become one
        text, self._buf = self._buf, ""
        return self._say(text)

    def finish(self) -> list[Event]:
        text, self._buf = self._buf, ""
        calls = parse_calls(text) if self._mode == "calls" else None
        if calls is None:
            self.failures += self._mode == "calls"
            return self._say(text)
        return self._record(calls)


register_family(
    Family(
        "llama3",
        tool_parser="llama3_json",
        teaches_tools=lambda template: PYTHON_TAG in template or "Environment: ipython" in template,
        stop_tokens=("<|eot_id|>", "<|eom_id|>"),  # a turn's end; `<|eom_id|>`: after a call
    )
)
