"""Qwen3: `<think>...</think>` reasoning; its tool calls are Hermes', its turns ChatML's.

The answer may open the block, or start inside it (the prompt ended with `<think>`); no
block: all content; never closed (cut off): all reasoning. Newlines around the reasoning
and at the answer's start are the template's framing, not text.
"""

from __future__ import annotations

import re

from gateway.chat.events import Event
from gateway.chat.families import Family, register_family
from gateway.chat.parsers import REASONING_PARSERS, ReasoningParser, scan

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# where the parser is in the answer
_START, _REASONING, _CONTENT = "start", "reasoning", "content"


@REASONING_PARSERS.register("qwen3")
class ThinkReasoningParser(ReasoningParser):
    starts_inside = False  # True: even when the prompt did not open the block

    def __init__(self, prompt_text: str = "") -> None:
        super().__init__(prompt_text)
        inside = self.starts_inside or prompt_text.rstrip().endswith(THINK_OPEN)
        self._state = _REASONING if inside else _START
        self._buf = ""
        self._held_nl = ""  # newlines that may be the last of the reasoning (dropped)
        self._lead = True  # at the start of the reasoning or the content: skip newlines

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while self._buf:
            if self._state == _START:
                head = self._buf.lstrip()
                if THINK_OPEN.startswith(head):
                    break  # could still become `<think>`
                if head.startswith(THINK_OPEN):
                    self._buf = head[len(THINK_OPEN) :]
                    self._state = _REASONING
                else:
                    self._state, self._lead = _CONTENT, False
            elif self._state == _REASONING:
                if self._lead and self._buf.lstrip().startswith(THINK_OPEN):
                    self._buf = self._buf.lstrip()[len(THINK_OPEN) :]  # opened twice
                    continue
                if self._lead and THINK_OPEN.startswith(self._buf.lstrip()):
                    break  # may be an opening tag the prompt already wrote
                thought, closed, self._buf = scan(self._buf, (THINK_CLOSE,))
                events += self._reasoning_text(thought)
                if closed is None:
                    break
                self._state, self._held_nl, self._lead = _CONTENT, "", True
            else:
                events += self._say(self._unlead(self._buf))
                self._buf = ""
        return events

    def finish(self) -> list[Event]:
        text, self._buf = self._buf, ""
        if self._state == _REASONING:
            return self._reasoning_text(text)
        self._lead = self._lead and self._state == _CONTENT
        return self._say(self._unlead(text))

    def _unlead(self, text: str) -> str:
        if self._lead:
            text = text.lstrip("\n")
            self._lead = not text
        return text

    def _reasoning_text(self, text: str) -> list[Event]:
        text = self._held_nl + self._unlead(text)
        body = text.rstrip("\n")
        self._held_nl = text[len(body) :]
        return self._reason(body)


register_family(
    Family(
        "qwen3",
        reasoning_parser="qwen3",
        shows_reasoning=lambda template: THINK_CLOSE in template,
        reasoning_block=re.compile(
            re.escape(THINK_OPEN) + "(.*?)" + re.escape(THINK_CLOSE), re.DOTALL
        ),
    )
)
