"""gpt-oss's harmony answers: messages split by channel, incrementally.

The prompt ends with `<|start|>assistant`, so an answer is one or more messages:
`[ to=RECIPIENT]<|channel|>CHANNEL[ <|constrain|>json]<|message|>BODY<|end|>`, the next
starting with `<|start|>assistant`. `analysis` bodies are reasoning; `final` (and a
`commentary` preamble addressed to no one) are the answer's text; a message addressed
`to=` a tool is a call, passed on whole to the tool parser as
`<|start|>assistant` + header + `<|message|>` + body + `<|call|>` (its stop token is not
in the text) - tool_parsers/harmony.py reads it. The recipient may stand before the
channel (as openai-harmony renders it) or after it (as the model often writes it).
Text that is not in a message at all is content.
"""

from __future__ import annotations

import re

from gateway.chat.detokenize import partial_suffix_len
from gateway.chat.reasoning_parsers.base import ReasoningParser, register_reasoning_parser
from gateway.chat.tool_parsers.base import Event
from gateway.chat.tool_parsers.harmony import (
    CALL,
    CALL_OPEN,
    CHANNEL,
    END,
    MESSAGE,
    RETURN,
    START,
)

_ENDS = (END, CALL, RETURN, START)  # what ends a message's body
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")

# where the parser is
_HEADER, _BODY, _BETWEEN = "header", "body", "between"


@register_reasoning_parser("harmony", detect=lambda template: CHANNEL in template)
class HarmonyReasoningParser(ReasoningParser):
    def __init__(self, prompt_text: str = "") -> None:
        super().__init__(prompt_text)
        self._state = _HEADER
        self._buf = ""
        self._header = ""
        self._kind = ""  # reasoning | content | call
        self._call_body = ""
        self._after_start = False  # the header being read followed a `<|start|>`

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while self._buf:
            if self._state == _HEADER:
                at = self._buf.find(MESSAGE)
                if at < 0:
                    break  # a header is short: wait for all of it
                self._open(self._buf[:at])
                self._buf = self._buf[at + len(MESSAGE) :]
            elif self._state == _BODY:
                hit = _first(self._buf, _ENDS)
                if hit is None:
                    ready = len(self._buf) - partial_suffix_len(self._buf, _ENDS)
                    events += self._body(self._buf[:ready])
                    self._buf = self._buf[ready:]
                    break
                at, marker = hit
                events += self._body(self._buf[:at])
                events += self._close()
                self._buf = self._buf[at + len(marker) :]
                self._state = _HEADER if marker == START else _BETWEEN
                self._after_start = marker == START
            else:  # between messages: only `<|start|>` is expected
                at = self._buf.find(START)
                if at < 0:
                    ready = len(self._buf) - partial_suffix_len(self._buf, (START,))
                    events += self._say(self._buf[:ready])
                    self._buf = self._buf[ready:]
                    break
                events += self._say(self._buf[:at])
                self._buf = self._buf[at + len(START) :]
                self._state, self._after_start = _HEADER, True
        return events

    def finish(self) -> list[Event]:
        text, self._buf = self._buf, ""
        if self._state == _BODY:
            return self._body(text) + self._close()
        if self._state == _HEADER and text:  # not a message after all
            return self._say((START if self._after_start else "") + text)
        return self._say(text)

    def _open(self, header: str) -> None:
        self._header = header
        self._state = _BODY
        channel = _CHANNEL.search(header)
        if _RECIPIENT.search(header):
            self._kind, self._call_body = "call", ""
        elif channel is not None and channel.group(1) == "analysis":
            self._kind = "reasoning"
        else:
            self._kind = "content"

    def _body(self, text: str) -> list[Event]:
        if self._kind == "call":
            self._call_body += text
            return []
        return self._reason(text) if self._kind == "reasoning" else self._say(text)

    def _close(self) -> list[Event]:
        if self._kind != "call":
            return []
        header = self._header
        header = header[len("assistant") :] if header.startswith("assistant") else header
        return self._say(CALL_OPEN + header + MESSAGE + self._call_body + CALL)


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """The earliest of `markers` in `text`: (index, marker), or None."""
    hits = [(i, m) for m in markers if (i := text.find(m)) >= 0]
    return min(hits) if hits else None
