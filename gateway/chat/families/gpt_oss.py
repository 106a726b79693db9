"""gpt-oss: prompts in the harmony format, rendered by OpenAI's own `openai-harmony` (the
reference: `--chat-template harmony`, or chosen for a tokenizer with harmony's tokens
and no chat template), and answers split by channel.

Offline: its o200k_base vocabulary is written from the loaded tokenizer (docs/gateway.md).

Answers: the prompt ends with `<|start|>assistant`, so an answer is messages
`[ to=RECIPIENT]<|channel|>CHANNEL[ <|constrain|>json]<|message|>BODY<|end|>`
(the recipient before the channel, as openai-harmony writes it, or after, as the model
often does). `analysis` is reasoning; `final` (or a preamble to no one) is text; a
message `to=` a tool is a call, passed on to the tool parser as `<|start|>assistant`
+ header + `<|message|>` + body + `<|call|>`. A call to anything but a function, or
with arguments that are not a JSON object, comes back as text and is counted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from functools import partial
from pathlib import Path
from typing import Any

from gateway.chat.events import Event
from gateway.chat.families import Family, register_family
from gateway.chat.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    BlockToolParser,
    ReasoningParser,
    arguments_json,
    scan,
)
from gateway.chat.template_traits import TemplateTraits
from gateway.chat.tokenizer import bytes_to_unicode
from gateway.inference.model_source import cache_root

ENCODING_FILE = "o200k_base.tiktoken"
# what openai-harmony 0.0.8 expects of that file (the published o200k_base)
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# harmony's tokens
START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
CALL, END, RETURN = "<|call|>", "<|end|>", "<|return|>"
HARMONY_TOKENS = (START, CHANNEL, MESSAGE, END, CALL)


def is_harmony_tokenizer(tokenizer: Any) -> bool:
    vocab = tokenizer.get_vocab()
    return all(t in vocab for t in HARMONY_TOKENS)


def tiktoken_vocabulary(tokenizer: Any) -> bytes:
    """The tokenizer's BPE ranks in tiktoken's file format (`base64(bytes) rank` lines)."""
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    decode = {c: b for b, c in bytes_to_unicode().items()}  # vocab character -> byte
    ranked = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    return b"".join(
        base64.b64encode(bytes(decode[c] for c in token)) + b" %d\n" % rank
        for token, rank in ranked
    )


def encodings_dir(tokenizer: Any) -> Path:
    """A folder holding o200k_base.tiktoken, written from `tokenizer` if missing."""
    folder = cache_root() / "harmony"
    path = folder / ENCODING_FILE
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == O200K_SHA256:
        return folder
    data = tiktoken_vocabulary(tokenizer)
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise ValueError("this tokenizer's vocabulary is not gpt-oss's o200k: no harmony")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return folder


_ENCODING: Any = None


def harmony_encoding(tokenizer: Any) -> Any:
    """openai-harmony's gpt-oss encoding, loaded from the local vocabulary (once)."""
    global _ENCODING
    if _ENCODING is None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(encodings_dir(tokenizer)))
        _ENCODING = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    return _ENCODING


class HarmonyTemplate:
    """Normalised OpenAI chat messages -> a harmony prompt's text: system messages are
    the developer message's instructions, next to the tools; an assistant turn is its
    `analysis`, then its calls (`commentary`, `to=functions.NAME`) or `final` answer (and
    harmony drops the analysis of turns that reached one); a tool result is a message
    from `functions.NAME` (the call it answers)."""

    # it renders tools and calls itself, reads arguments as objects and reasoning
    traits = TemplateTraits(True, True, False, False, True)

    def __init__(self, tokenizer: Any) -> None:
        self.encoding = harmony_encoding(tokenizer)

    @staticmethod
    def standalone(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Tool results with the `name` of the call they answer, so that a result renders
        the same when the assistant message that made the call is not at hand."""
        names = {
            tc.get("id"): (tc.get("function") or {}).get("name")
            for m in messages
            if m.get("role") == "assistant"
            for tc in m.get("tool_calls") or []
        }
        return [
            {**m, "name": names[m.get("tool_call_id")]}
            if m.get("role") == "tool" and names.get(m.get("tool_call_id"))
            else m
            for m in messages
        ]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        from openai_harmony import Conversation, Role

        ids = self.encoding.render_conversation_for_completion(
            Conversation.from_messages(self.messages(self.standalone(messages), tools)),
            Role.ASSISTANT,
        )
        return self.encoding.decode_utf8(ids)

    def messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[Any]:
        from openai_harmony import (
            Author,
            DeveloperContent,
            Message,
            Role,
            SystemContent,
            ToolDescription,
        )

        instructions = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools(
                [
                    ToolDescription.new(
                        fn["name"], fn.get("description", ""), parameters=fn.get("parameters")
                    )
                    for fn in (t.get("function", t) for t in tools)
                ]
            )
        out = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new())]
        if instructions or tools:
            out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
        assistant = partial(Message.from_role_and_content, Role.ASSISTANT)
        for m in messages:
            role = m["role"]
            if role == "user":
                out.append(Message.from_role_and_content(Role.USER, m["content"]))
            elif role == "assistant":
                if m.get("reasoning_content"):
                    out.append(assistant(m["reasoning_content"]).with_channel("analysis"))
                for tc in m.get("tool_calls") or []:
                    fn = tc["function"]
                    args = fn["arguments"]
                    text = args if isinstance(args, str) else json.dumps(args)
                    out.append(
                        assistant(text)
                        .with_channel("commentary")
                        .with_recipient(f"functions.{fn['name']}")
                        .with_content_type("<|constrain|>json")
                    )
                if m.get("content") or not m.get("tool_calls"):
                    out.append(assistant(m.get("content") or "").with_channel("final"))
            elif role == "tool":
                name = m.get("name") or "unknown"  # the call's (`standalone`)
                out.append(
                    Message.from_author_and_content(
                        Author.new(Role.TOOL, f"functions.{name}"), m["content"]
                    )
                    .with_channel("commentary")
                    .with_recipient("assistant")
                )
        return out


# ---- answers: the messages (reasoning parser), then the calls among them (tool parser)

CALL_OPEN = START + "assistant"  # how a call message reaches the tool parser

_FUNCTION = re.compile(r"\bto=functions\.([^\s<]+)")


@TOOL_PARSERS.register("harmony")
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


_ENDS = (END, CALL, RETURN, START)  # what ends a message's body
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")

# where the parser is
_HEADER, _BODY, _BETWEEN = "header", "body", "between"


@REASONING_PARSERS.register("harmony")
class HarmonyReasoningParser(ReasoningParser):
    def __init__(self, prompt_text: str = "") -> None:
        super().__init__(prompt_text)
        self._state = _HEADER
        self._buf = ""
        self._kind = ""  # reasoning | content | call
        self._after_start = False  # the header being read followed a `<|start|>`

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while self._buf:
            if self._state == _HEADER:
                header, found, rest = self._buf.partition(MESSAGE)
                if not found:
                    break  # a header is short: wait for all of it
                channel = _CHANNEL.search(header)
                analysis = channel is not None and channel.group(1) == "analysis"
                kind = (
                    "call" if _RECIPIENT.search(header) else "reasoning" if analysis else "content"
                )
                if kind == "call":  # the tool parser's block opens
                    events += self._say(CALL_OPEN + header.removeprefix("assistant") + MESSAGE)
                self._kind, self._buf, self._state = kind, rest, _BODY
            elif self._state == _BODY:
                body, marker, self._buf = scan(self._buf, _ENDS)
                events += self._body(body)
                if marker is None:
                    break
                events += self._close()
                self._state = _HEADER if marker == START else _BETWEEN
                self._after_start = marker == START
            else:  # between messages: only `<|start|>` is expected
                before, marker, self._buf = scan(self._buf, (START,))
                events += self._say(before)
                if marker is None:
                    break
                self._state, self._after_start = _HEADER, True
        return events

    def finish(self) -> list[Event]:
        text, self._buf = self._buf, ""
        if self._state == _BODY:
            return self._body(text) + self._close()
        if self._state == _HEADER and text:  # not a message after all
            return self._say((START if self._after_start else "") + text)
        return self._say(text)

    def _body(self, text: str) -> list[Event]:
        return self._reason(text) if self._kind == "reasoning" else self._say(text)

    def _close(self) -> list[Event]:
        return self._say(CALL) if self._kind == "call" else []


register_family(
    Family(
        "gpt_oss",
        tool_parser="harmony",
        reasoning_parser="harmony",
        teaches_tools=lambda template: CHANNEL in template,  # a Jinja port of harmony
        shows_reasoning=lambda template: CHANNEL in template,
        stop_tokens=(CALL,),  # a call ends the answer
        renderer=HarmonyTemplate,
        renderer_name="harmony",
        renders_tokenizer=is_harmony_tokenizer,  # its tokenizers ship no Jinja template
    )
)
