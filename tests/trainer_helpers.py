"""Agents and a tiny random model for fast trainer runs (real gateway, real DeepSpeed)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any


def tiny_llama(vocab_size: int = 512, max_positions: int = 128, **extra: Any) -> Any:
    """A seeded 2-layer random Llama: small enough to check packing and gradients exactly."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        **extra,
    )
    return LlamaForCausalLM(cfg)


def make_tiny_model(path: Path, tokenizer: Any) -> Path:
    """A 2-layer Llama with SmolLM2's tokenizer: real HF folder, trains in well under 1 s."""
    model = tiny_llama(
        len(tokenizer),
        512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def rows(n: int = 8) -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": f"Count to {i}."}], "answer": str(i), "id": i}
        for i in range(n)
    ]


class RandomRewardAgent:
    """An OpenAI-SDK agent with two turns and a random reward: every group has signal."""

    def __init__(self, max_tokens: int = 8) -> None:
        self.max_tokens = max_tokens

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=extra_kwargs["base_url"],
            api_key=extra_kwargs["api_key"],
            http_client=extra_kwargs["http_client"],
            max_retries=0,
        )
        messages = list(data["messages"])
        first = await client.chat.completions.create(
            model="default", messages=messages, max_tokens=self.max_tokens
        )
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "Again."},
        ]
        await client.chat.completions.create(
            model="default", messages=messages, max_tokens=self.max_tokens
        )
        return random.random()
