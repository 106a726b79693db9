"""`POST /v1/completions` shapes: the request body, `Completion` and its stream chunks
(plain dicts in the `openai` package's shapes, as chat's are)."""

from __future__ import annotations

import time
from itertools import accumulate
from typing import Annotated, Any

from pydantic import Field

from gateway.entrypoints.openai.protocol import ChoicesRequest

_Text = Annotated[str, Field(min_length=1)]
_Ids = Annotated[list[int], Field(min_length=1)]


class CompletionRequest(ChoicesRequest):
    """`POST /v1/completions`: a prompt as text or token ids (or a list of either)."""

    prompt: (
        _Text
        | _Ids
        | Annotated[list[_Text], Field(min_length=1)]
        | Annotated[list[_Ids], Field(min_length=1)]
    )
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """The prompts of a (possibly batched) request, each text or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


def logprobs(
    tokenizer: Any, req: CompletionRequest, ids: list[int], lps: list[float], top: Any
) -> dict[str, Any] | None:
    """Logprobs as `Completion` gives them (None: not asked for)."""
    if req.logprobs is None:
        return None
    tokens = [tokenizer.decode([t]) for t in ids]
    offsets = list(accumulate(map(len, tokens), initial=0))[:-1]  # where each starts
    top_lp = None
    if req.logprobs and top is not None:
        top_lp = [{tokenizer.decode([tid]): lp for tid, lp in alts} for alts in top]
    return {
        "tokens": tokens,
        "token_logprobs": list(lps),
        "top_logprobs": top_lp,
        "text_offset": offsets,
    }


def choice(index: int, text: str, finish: str | None, lp: Any = None) -> dict[str, Any]:
    """A choice (an aborted one as `stop`: the API knows no other)."""
    finish = "stop" if finish == "abort" else finish
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": lp}


def body(req: CompletionRequest, cid: str, **fields: Any) -> dict[str, Any]:
    """A `Completion` (whole, or one chunk of a stream: `sse_event` it)."""
    created = int(time.time())
    return {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": req.model,
        **fields,
    }
