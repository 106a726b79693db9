"""`POST /v1/completions` shapes: the request body, `Completion` and its stream chunks."""

from __future__ import annotations

import time
from itertools import accumulate
from typing import Any

from openai.types import Completion, CompletionChoice
from openai.types.completion_choice import Logprobs
from openai.types.completion_usage import CompletionUsage
from pydantic import Field, field_validator

from gateway.entrypoints.openai.protocol import ChoicesRequest


class CompletionRequest(ChoicesRequest):
    """`POST /v1/completions`: a prompt as text or token ids (or a list of either)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, prompt: Any) -> Any:
        if isinstance(prompt, (str, list)) and len(prompt) == 0:
            raise ValueError("prompt must not be empty")
        if isinstance(prompt, list) and any(
            isinstance(p, (str, list)) and len(p) == 0 for p in prompt
        ):
            raise ValueError("prompt must not contain an empty prompt")
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """The prompts of a (possibly batched) request, each text or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class CompletionShapes:
    """Logprobs as `Completion` gives them; holds the tokenizer for their token strings."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def logprobs(
        self, req: CompletionRequest, ids: list[int], lps: list[float], top: Any
    ) -> Logprobs | None:
        if req.logprobs is None:
            return None
        tokens = [self.tokenizer.decode([t]) for t in ids]
        offsets = list(accumulate(map(len, tokens), initial=0))[:-1]  # where each starts
        top_lp = None
        if req.logprobs and top is not None:
            top_lp = [{self.tokenizer.decode([tid]): lp for tid, lp in alts} for alts in top]
        return Logprobs.model_construct(
            tokens=tokens, token_logprobs=list(lps), top_logprobs=top_lp, text_offset=offsets
        )


def choice(index: int, text: str, finish: str | None, lp: Logprobs | None = None) -> Any:
    """A choice (an aborted one as `stop`: the API knows no other)."""
    finish = "stop" if finish == "abort" else finish
    return CompletionChoice.model_construct(
        index=index, text=text, finish_reason=finish, logprobs=lp
    )


def body(req: CompletionRequest, cid: str, **fields: Any) -> dict[str, Any]:
    """A `Completion` (whole, or one chunk of a stream: `sse_event` it) as JSON data."""
    completion = Completion.model_construct(
        id=cid, object="text_completion", created=int(time.time()), model=req.model, **fields
    )
    return completion.model_dump(mode="json", exclude_unset=True)


def usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    return CompletionUsage.model_construct(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
