"""Windowed renders (gateway/chat/template_window.py): a template proven to render each
message on its own renders only a turn's new messages, and the ids are exactly those of
the whole render; a template that is not provably so is refused and rendered whole."""

from __future__ import annotations

import random

import pytest
from family_helpers import FAMILIES, family_tokenizer

from gateway.chat.template import ChatRenderer

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEN = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
MACRO = (
    "{% macro turn(m) %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endmacro %}"
    "{% if messages[0].role == 'system' %}{% set named = messages[0].content %}{% endif %}"
    "{% for message in messages %}{% if loop.first and named is not defined %}"
    "<|im_start|>system\nDefault.<|im_end|>\n{% endif %}{{ turn(message) }}"
    "{% if message.tool_calls %}{% for c in message.tool_calls %}{{ c.function.name }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}{% endif %}{% endfor %}" + GEN
)
ADMITTED = {"chatml": CHATML, "macro, messages[0], inner loops": MACRO}


def _loop(body: str, before: str = "", after: str = GEN) -> str:
    return before + "{% for message in messages %}" + body + "{% endfor %}" + after


PLAIN = "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
REFUSED = {
    "loop.last": _loop(PLAIN + "{% if loop.last %}!{% endif %}"),
    "loop.index": _loop(
        "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>{{ loop.index }}\n"
    ),  # fmt: skip
    "messages|length": _loop(PLAIN + "{{ messages | length }}"),
    "messages[-1]": _loop(PLAIN, before="{{ messages[-1].content }}"),
    "namespace": _loop(
        "{% set ns.n = ns.n + 1 %}" + PLAIN, before="{% set ns = namespace(n=0) %}"
    ),  # fmt: skip
    "a set in the loop": _loop("{% set r = message.role %}" + PLAIN),
    "joiner": _loop("{{ sep() }}" + PLAIN, before="{% set sep = joiner('|') %}"),
    "strftime_now": _loop(PLAIN, before="{{ strftime_now('%d %b %Y') }}"),
    "break": _loop(PLAIN + "{% if message.role == 'tool' %}{% break %}{% endif %}"),
    "set messages": _loop(PLAIN, before="{% set messages = messages[1:] %}"),
    "two loops": _loop(PLAIN) + _loop(PLAIN, after=""),
    "a filtered loop": "{% for message in messages if message.content %}"
    + PLAIN
    + "{% endfor %}"
    + GEN,
    "random": _loop(PLAIN + "{{ [1, 2] | random }}"),
}


def _session(renderer: ChatRenderer, seed: int, turns: int = 6) -> tuple[int, int]:
    """A session's renders, each compared with the whole render: (windowed, wrong)."""
    tok, rng = renderer.tokenizer, random.Random(seed)
    tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
    tools = tools if rng.random() < 0.5 else None
    messages = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.5 else []
    messages.append({"role": "user", "content": f"Question {seed}?"})
    parent, windowed, wrong = None, 0, 0
    for turn in range(turns):
        rendered = renderer.render(messages, tools, parent=parent)
        text = renderer.render_text(messages, tools)
        whole = tok.encode(text, add_special_tokens=False)
        wrong += rendered.ids != whole or "".join(rendered.parts) != text
        windowed += len(rendered.parts) > 1
        answer = " ".join(rng.choice(["yes", "no", "maybe", "42", "run it"]) for _ in range(4))
        output = tok.encode(answer + "<|im_end|>", add_special_tokens=False)
        parent = (rendered.ids, output, renderer.text_prefix(rendered, output))
        messages.append({"role": "assistant", "content": answer})
        if rng.random() < 0.3:  # a tool's result
            messages.append({"role": "tool", "content": f"exit {turn}"})
        messages.append({"role": "user", "content": f"Next {turn} " * rng.randrange(1, 5)})
    return windowed, wrong


@pytest.mark.parametrize("name", sorted(ADMITTED))
def test_an_admitted_template_renders_only_new_messages_and_gives_the_whole_renders_ids(
    tokenizer, name: str
) -> None:
    renderer = ChatRenderer(tokenizer, chat_template=ADMITTED[name])
    assert renderer.not_windowed is None
    windowed = 0
    for seed in range(40):
        w, wrong = _session(renderer, seed)
        assert wrong == 0
        windowed += w
    assert windowed == 40 * 5  # every turn after the first


def test_the_bundled_template_is_admitted_and_the_families_templates_are_not(tokenizer) -> None:
    assert ChatRenderer(tokenizer).not_windowed is None  # SmolLM2's ChatML
    for name in FAMILIES:  # Qwen3 (namespace), Llama 3.1 and DeepSeek V3 (messages[1:]),
        # gpt-oss (harmony, not a Jinja render)
        assert ChatRenderer(family_tokenizer(name)).not_windowed is not None, name


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_template_that_is_not_provably_message_local_is_refused(tokenizer, name) -> None:
    renderer = ChatRenderer(tokenizer, chat_template=REFUSED[name])
    assert renderer.not_windowed is not None
    if name == "random":
        return  # no two renders agree: nothing to compare
    for seed in range(3):  # and rendered whole, rightly
        windowed, wrong = _session(renderer, seed)
        assert (windowed, wrong) == (0, 0)


def test_the_rules_matter_a_refused_template_windowed_anyway_gives_wrong_ids(tokenizer) -> None:
    """`loop.index` after each answer: the window numbers its messages from 2 on, and
    nothing in the text check can see it. Admitted by force, the ids go wrong."""
    renderer = ChatRenderer(tokenizer, chat_template=REFUSED["loop.index"])
    renderer.not_windowed = None
    assert sum(_session(renderer, seed)[1] for seed in range(5)) > 0


def test_changed_tools_or_an_edited_history_render_the_whole(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer)
    tok = renderer.tokenizer
    first = [{"role": "user", "content": "Hi"}]
    r1 = renderer.render(first)
    output = tok.encode("Hello<|im_end|>", add_special_tokens=False)
    parent = (r1.ids, output, renderer.text_prefix(r1, output))
    later = [*first, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Go"}]
    assert len(renderer.render(later, parent=parent).parts) == 3  # windowed: prompt, answer, new
    tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
    for messages, with_tools in (
        (later, tools),  # tools added since the parent
        ([{"role": "user", "content": "Hi!"}, *later[1:]], None),  # its question edited
    ):
        r2 = renderer.render(messages, with_tools, parent=parent)
        assert r2.parts == (r2.text,)  # rendered whole
        assert r2.ids == tok.encode(renderer.render_text(messages, with_tools),
                                    add_special_tokens=False)  # fmt: skip
