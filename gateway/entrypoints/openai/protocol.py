"""Request fields the OpenAI generating endpoints share: model, sampling, streaming; and
the `usage` of chat and text completions.

Unknown fields (`store`, `metadata`, `user`, ...) are accepted and ignored, as real agent
frameworks send plenty of them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class OpenAIRequest(BaseModel):
    """What every endpoint takes (chat, completions, responses)."""

    model_config = ConfigDict(extra="allow")

    model: str = "default"
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    # what torch, vLLM and SGLang take (a larger one crashed the embedded engine)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stream: bool = False


class ChoicesRequest(OpenAIRequest):
    """Chat and text completions: `n` choices, stop strings, stream options."""

    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    stream_options: dict[str, Any] | None = None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A chat or text completion's `usage`."""
    return {
        "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
