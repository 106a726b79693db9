"""gpt-oss's harmony tool calls: a message addressed `to=functions.NAME`, its body the
arguments as JSON.

The harmony reasoning parser (reasoning_parsers/harmony.py) splits the answer into
messages and hands each call message on as `<|start|>assistant` + header +
`<|message|>` + arguments + `<|call|>`; this reads the name from the header's recipient.
A call to anything but a function, or with arguments that are not a JSON object,
comes back as that text and is counted.
"""

from __future__ import annotations

import re

from gateway.chat.tool_parsers.base import BlockToolParser, arguments_json, register_tool_parser

# harmony's tokens (the reasoning parser shares them)
START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
CALL, END, RETURN = "<|call|>", "<|end|>", "<|return|>"
CALL_OPEN = START + "assistant"  # how a call message reaches this parser

_FUNCTION = re.compile(r"\bto=functions\.([^\s<]+)")


@register_tool_parser("harmony", detect=lambda template: CHANNEL in template)
class HarmonyToolParser(BlockToolParser):
    open = CALL_OPEN
    close = CALL

    def parse_block(self, body: str) -> list[tuple[str, str]] | None:
        header, sep, args = body.partition(MESSAGE)
        name = _FUNCTION.search(header)
        arguments = arguments_json(args.strip()) if sep else None
        if name is None or arguments is None:
            return None
        return [(name.group(1), arguments)]
