"""A long system prompt many sessions share is encoded once, and never changes the ids."""

from __future__ import annotations

from gateway.chat.prompt_heads import HeadCache
from gateway.chat.template import ChatRenderer

SYSTEM = "You are a careful assistant. " * 40  # ~1.2 kB, as agent harnesses send


def test_shared_head_is_encoded_once_and_gives_the_same_ids(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer)
    calls: list[int] = []
    plain = renderer.heads._encode
    renderer.heads._encode = lambda text: calls.append(len(text)) or plain(text)  # type: ignore[method-assign]
    for i in range(6):
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Question number {i}: what is {i} + {i}?"},
        ]
        rendered = renderer.render(messages)
        assert rendered.ids == tokenizer.encode(rendered.text, add_special_tokens=False)
    assert renderer.heads.hits == 4  # seen, then checked and kept, then used four times
    # from the third prompt on only the text after the system block is encoded
    assert max(calls[-3:]) < len(SYSTEM) / 4


def test_a_head_whose_ids_do_not_split_off_is_never_used() -> None:
    # a tokenizer whose ids depend on the whole text: splitting would change them
    def encode(text: str) -> list[int]:
        return [len(text), hash(text) % 1000]

    cache = HeadCache(encode, ["<|sep|>"], min_chars=8)
    texts = [f"a long shared head<|sep|>tail {i}" for i in range(5)]
    assert [cache.encode(t) for t in texts] == [encode(t) for t in texts]
    assert cache.hits == 0 and cache.refused == 1  # tried once, then left alone


def test_short_prompts_are_encoded_whole() -> None:
    cache = HeadCache(lambda t: [len(t)], ["<|sep|>"], min_chars=512)
    assert cache.encode("short<|sep|>text") == [16]
    assert cache.hits == 0 and cache.refused == 0
