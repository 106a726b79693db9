"""Turning OpenAI messages into the exact prompt token ids the engine sees, and back.

The gateway renders the model's own chat template itself, so the prompt ids it
records are the ones that were generated from, not a later re-tokenisation.
"""

from __future__ import annotations

import json
from typing import Any

from transformers import PreTrainedTokenizerBase

from gateway.chat.tool_parsers import detect_tool_parser
from gateway.chat.tools import inline_tools


def text_of(content: Any) -> str:
    """OpenAI content may be None, a string, or a list of parts; templates want a string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in (
                "text",
                "input_text",
                "output_text",
            ):
                parts.append(str(part.get("text", "")))
        return "".join(parts)
    return str(content)


def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message in the shape HF chat templates expect."""
    role = message.get("role")
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": text_of(message.get("content")),
    }
    tool_calls = message.get("tool_calls")
    if tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.get("id"),
                "type": "function",
                "function": {
                    "name": tc.get("function", {}).get("name"),
                    "arguments": _json_or_text(tc.get("function", {}).get("arguments")),
                },
            }
            for tc in tool_calls
        ]
    if role == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    if message.get("name"):
        out["name"] = message["name"]
    return out


def _json_or_text(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


class ChatRenderer:
    """Holds one tokenizer; rendering reuses its compiled template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id: int = int(tokenizer.eos_token_id)
        stops = {self.eos_token_id}
        for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
            tid = tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
                stops.add(tid)
        self.stop_token_ids: list[int] = sorted(stops)
        # Templates that know tools render them (and past tool calls) themselves; for
        # the others the gateway writes them into the messages (see tool_prompt.py).
        template = tokenizer.chat_template
        self.native_tools = isinstance(template, str) and "tools" in template
        # The tool-call format to parse: the template's own, or the Hermes form the
        # gateway's tool prompt asks for.
        self.tool_parser = detect_tool_parser(template) if self.native_tools else "hermes"

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
    ) -> list[int]:
        text = self.render_text(messages, tools, tool_choice)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
    ) -> str:
        normalized = [normalize_message(m) for m in messages]
        if self.native_tools:
            return self.tokenizer.apply_chat_template(
                normalized, tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        return self.tokenizer.apply_chat_template(
            inline_tools(normalized, tools, tool_choice),
            add_generation_prompt=True,
            tokenize=False,
        )

    def decode_output(self, output_ids: list[int]) -> str:
        """Text of the answer, without the stop token that ended it."""
        ids = output_ids
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
