"""Our chat-template environment (gateway/chat/jinja_env.py) against transformers' own.

The gateway compiles chat templates itself on jinja2's public API, the way transformers
documents them, and keeps the sandbox's verdicts per (type, attribute). These tests hold
it to `tokenizer.apply_chat_template(..., tokenize=False)`, transformers' public API:
every family's real template over message lists with system prompts, tools, tool calls
and results, and reasoning; and each piece of the environment we rely on (filters,
globals, extensions, whitespace control, the sandbox's refusals), so an upgrade of
transformers that changes the contract fails here. The versions are pinned in
requirements.lock; `test_the_installed_versions_are_the_pinned_ones` says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import transformers
from family_helpers import FAMILIES, family_tokenizer
from jinja2.exceptions import SecurityError, TemplateError

from gateway.chat.jinja_env import compile_chat_template
from gateway.chat.template import ChatRenderer, normalize_message
from gateway.chat.template_traits import TemplateTraits
from gateway.chat.tokenizer import load_tokenizer
from gateway.inference.model_source import resolve_model_dir

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city <b>now</b> & later",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "Pâris, 東京"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "id": "call1abcd",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "one_user": ([{"role": "user", "content": "Hi there"}], None),
    "system_and_turns": (
        [
            {"role": "system", "content": "You are terse. {{ not a template }}"},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3? Ünïcode, 日本語, <|im_end|>"},
        ],
        None,
    ),
    "tools_and_calls": (
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call1abcd", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "21 degrees."},
            {"role": "user", "content": "Thanks"},
        ],
        TOOLS,
    ),
    "reasoning": (
        [
            {"role": "user", "content": "Think first: 7*6?"},
            {"role": "assistant", "content": "42", "reasoning_content": "7*6 is 42"},
            {"role": "user", "content": "Again, 6*7?"},
        ],
        None,
    ),
}


def _template(name: str, tok: Any) -> str:
    template = FAMILIES[name].chat_template if name in FAMILIES else None
    return template or tok.chat_template


def _jinja_families() -> list[str]:
    """Families rendered by a Jinja template (gpt-oss's is harmony, not Jinja)."""
    return [n for n, f in FAMILIES.items() if n != "gptoss"] + ["smollm2"]


def _tokenizer(name: str) -> Any:
    if name == "smollm2":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(resolve_model_dir(None))
    return family_tokenizer(name)


def _aliased(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the renderer hands the template: reasoning also as `thinking` (as transformers)."""
    return [{"thinking": m["reasoning_content"], **m} if "reasoning_content" in m else m
            for m in messages]  # fmt: skip


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", _jinja_families())
def test_every_family_renders_as_apply_chat_template(name: str, conversation: str) -> None:
    tok = _tokenizer(name)
    template = _template(name, tok)
    traits = TemplateTraits.of(template)
    messages, tools = CONVERSATIONS[conversation]
    normalized = [normalize_message(m, traits) for m in messages]
    # apply_chat_template drops keys whose value is None; compare on messages without any
    normalized = [{k: v for k, v in m.items() if v is not None} for m in normalized]
    theirs = _outcome(
        lambda: tok.apply_chat_template(
            normalized, tools=tools, tokenize=False, add_generation_prompt=True,
            chat_template=template,
        )
    )  # fmt: skip
    for _ in range(2):  # the second time through the kept verdicts
        ours = _outcome(
            lambda: compile_chat_template(template).render(
                messages=_aliased(normalized), tools=tools, documents=None,
                add_generation_prompt=True, **tok.special_tokens_map,
            )
        )  # fmt: skip
        assert ours == theirs


def _outcome(render: Any) -> tuple[str, str]:
    """("text", the render) or (the error's type, its message): a template that refuses
    a conversation (DeepSeek V3's, a call without `content: None`) refuses it in both."""
    try:
        return "text", render()
    except TemplateError as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", _jinja_families())
def test_the_renderer_on_our_tokenizer_equals_it_on_transformers(
    name: str, conversation: str
) -> None:
    """The whole prompt path (normalising, tool prompt, template, encode) on the
    gateway's own tokenizer gives the text and ids it gives on transformers'; where the
    template renders tools itself, that text is apply_chat_template's."""
    hf = _tokenizer(name)
    folder = resolve_model_dir(None) if name == "smollm2" else Path(hf.name_or_path)
    template = FAMILIES[name].chat_template if name in FAMILIES else None
    ours, theirs = ChatRenderer(load_tokenizer(folder), template), ChatRenderer(hf, template)
    messages, tools = CONVERSATIONS[conversation]
    a, b = ours.render(messages, tools), theirs.render(messages, tools)
    assert (a.text, list(a.ids)) == (b.text, list(b.ids))
    assert list(a.ids) == hf.encode(a.text, add_special_tokens=False)
    normalized = [normalize_message(m, ours.traits) for m in messages]
    if ours.traits.tools and not any(v is None for m in normalized for v in m.values()):
        assert a.text == hf.apply_chat_template(
            normalized, tools=tools, tokenize=False, add_generation_prompt=True,
            chat_template=ours.chat_template,
        )  # fmt: skip


# Each piece of transformers' environment a chat template may use, in one template.
CONTRACT = """\
{%- set ns = namespace(n=0) -%}
{%- for m in messages %}
  {%- if m.role == 'skip' %}{% continue %}{% endif %}
  {%- if m.role == 'stop' %}{% break %}{% endif %}
  {%- set ns.n = ns.n + 1 %}
  {%- generation %}[{{ m.role }}:{{ m.content | trim }}]{% endgeneration %}
{% endfor %}
n={{ ns.n }}
{{ tools | tojson }}
{{ tools | tojson(indent=2, sort_keys=true) }}
{{ tools | tojson(separators=(',', ':'), ensure_ascii=true) }}
{{ dict(a=1, b=[1, 2]) | tojson }} {{ dict.fromkeys(['x', 'y'], 0) | tojson }}
{{ strftime_now('%Y') | length }} {{ bos_token }}{{ eos_token }}
{%- if add_generation_prompt %}<go>{% endif %}
"""
CONTRACT_MESSAGES = [
    {"role": "user", "content": "  a <b>&amp; '\"  "},
    {"role": "skip", "content": "never"},
    {"role": "assistant", "content": "Ü 日本"},
    {"role": "stop", "content": "x"},
    {"role": "user", "content": "never either"},
]
REFUSED = {
    "raise_exception": "{{ raise_exception('no ' + messages[0].content) }}",
    "namespace_dunder": "{% set ns = namespace(_x=1) %}{{ ns }}",
    "namespace_set_dunder": "{% set ns = namespace() %}{% set ns._y = 2 %}{{ ns._y }}",
    "str_format_escape": "{{ '{0.__class__.__mro__}'.format(messages) }}",
    "mutating_a_list": "{{ messages.append(1) }}",
}
READ_AS_UNDEFINED = {
    "dunder_attribute": "[{{ messages.__class__ }}]",
    "private_attribute": "[{{ messages[0]._secret }}]",
}


def test_the_environment_is_transformers_own(tokenizer) -> None:
    """Filters, globals, loop controls, the generation tag and whitespace control."""
    kwargs = dict(add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    theirs = tokenizer.apply_chat_template(
        CONTRACT_MESSAGES, tools=TOOLS, chat_template=CONTRACT, tokenize=False, **kwargs
    )
    ours = compile_chat_template(CONTRACT).render(
        messages=CONTRACT_MESSAGES, tools=TOOLS, documents=None, **kwargs
    )
    assert ours == theirs
    assert "[user:a <b>&amp; '\"]" in ours and "Ü 日本" in ours and "never" not in ours


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_sandbox_refuses_what_transformers_refuses(tokenizer, case: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError) as theirs:
        tokenizer.apply_chat_template(messages, chat_template=REFUSED[case], tokenize=False)
    for _ in range(2):  # the second time through the kept verdicts
        with pytest.raises(TemplateError) as ours:
            compile_chat_template(REFUSED[case]).render(messages=messages)
        assert type(ours.value) is type(theirs.value)
        assert isinstance(ours.value, SecurityError) == isinstance(theirs.value, SecurityError)


@pytest.mark.parametrize("case", list(READ_AS_UNDEFINED))
def test_unsafe_attributes_read_as_undefined(tokenizer, case: str) -> None:
    messages = [{"role": "user", "content": "hi", "_secret": "s"}]
    theirs = tokenizer.apply_chat_template(messages, chat_template=READ_AS_UNDEFINED[case],
                                           tokenize=False)  # fmt: skip
    compiled = compile_chat_template(READ_AS_UNDEFINED[case])
    assert compiled.render(messages=messages) == theirs
    assert compiled.render(messages=messages) == theirs


def test_the_installed_versions_are_the_pinned_ones() -> None:
    """The contract above was checked with these versions; a bump goes through the lock
    (and these tests) rather than slipping in."""
    lock = (ROOT / "requirements.lock").read_text()
    for package, version in (("transformers", transformers.__version__),
                             ("Jinja2", jinja2.__version__)):  # fmt: skip
        pinned = re.search(rf"^{package}==(\S+)$", lock, re.MULTILINE)
        assert pinned is not None, f"{package} is not pinned in requirements.lock"
        assert version == pinned.group(1), f"{package} {version} installed, lock pins {pinned[1]}"


def test_the_gateway_never_imports_transformers_internals() -> None:
    private = re.compile(r"from transformers[\w.]* import [^\n]*\b_\w+|transformers\.\w+\._")
    for path in (ROOT / "gateway").rglob("*.py"):
        assert not private.search(path.read_text()), path
