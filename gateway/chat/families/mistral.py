"""Mistral's `[TOOL_CALLS]` tool calls (Mistral 7B v0.3, Nemo, Small): a JSON list of
calls after the token, to the end of the answer (text before it is content).

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]</s>

Template quirk: its templates refuse a call id that is not 9 letters or digits, so
parsed calls get such ids, and other ids render as 9 hex digits of their sha256.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

from gateway.chat.families import Family, Message, register_family
from gateway.chat.families.hermes import parse_json_calls
from gateway.chat.parsers import TOOL_PARSERS, BlockToolParser

TOOL_CALLS = "[TOOL_CALLS]"
_ID = re.compile(r"[A-Za-z0-9]{9}")


def template_id(call_id: Any) -> Any:
    """A call id as Mistral's templates accept it (other values are left as they are)."""
    if not isinstance(call_id, str) or _ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def shape_message(message: Message) -> Message:
    """A normalised message with its call ids as the template accepts them."""
    if message.get("tool_calls"):
        calls = [{**tc, "id": template_id(tc.get("id"))} for tc in message["tool_calls"]]
        return {**message, "tool_calls": calls}
    if "tool_call_id" in message:
        return {**message, "tool_call_id": template_id(message["tool_call_id"])}
    return message


@TOOL_PARSERS.register("mistral")
class MistralToolParser(BlockToolParser):
    open = TOOL_CALLS
    close = "</s>"  # its stop token, when the text has it: else the block ends with the answer
    call_format = TOOL_CALLS + '[{"name": <function-name>, "arguments": <args-json-object>}]'

    def parse_block(self, body: str) -> list[tuple[str, str]] | None:
        calls: list[tuple[str, str]] = []
        for part in body.split(TOOL_CALLS):  # a model may open each call with the token
            found = parse_json_calls(part)
            if found is None:
                return None
            calls += found
        return calls

    def new_id(self) -> str:
        return uuid.uuid4().hex[:9]


register_family(
    Family(
        "mistral",
        tool_parser="mistral",
        teaches_tools=lambda template: TOOL_CALLS in template,
        shape_message=shape_message,
    )
)
