"""What one request is to the engine and the store: a `Turn`, and its choices' outputs."""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.inference.base import SamplingParams, TopLogprobs

Parent = tuple[str, list[int], list[int]]  # completion id, its prompt ids, its output ids


def request_hash(body: bytes) -> str:
    """Identity of a request body: a client retry sends the very same bytes."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def choice_ids(prefix: str, n: int) -> list[str]:
    """Completion ids of a request's choices: `<prefix>-<hex>`, then `<that>-1`, `-2`, ..."""
    first = f"{prefix}-{uuid.uuid4().hex}"
    return [first] + [f"{first}-{i}" for i in range(1, n)]


@dataclass(slots=True)
class Turn:
    """One request, as the engine and the store see it."""

    session_id: str
    endpoint: str
    model: str
    request: dict[str, Any]  # what the client asked for, as recorded
    prompt_ids: list[int]
    params: SamplingParams
    stops: list[str]
    parent: Parent | None
    ids: list[str]  # completion id of each choice
    request_hash: str | None = None
    started: float = field(default_factory=time.perf_counter)


@dataclass(slots=True)
class TextDelta:
    """Text that became final, and the output tokens behind it (for streamed logprobs)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[TopLogprobs] | None


@dataclass(slots=True)
class ChoiceOutput:
    index: int
    completion_id: str
    text: str  # cut before the stop string, if one was hit
    output_ids: list[int]  # the tokens that produced it (what is recorded)
    logprobs: list[float]
    versions: list[int]
    top_logprobs: list[TopLogprobs] | None
    finish_reason: str  # stop | length | abort (client gone)
    queue_s: float = 0.0
    gen_s: float = 0.0


def text_delta(
    text: str,
    ids: list[int],
    logprobs: list[float],
    top: list[TopLogprobs] | None,
    start: int,
    end: int,
) -> TextDelta:
    return TextDelta(
        text, ids[start:end], logprobs[start:end], None if top is None else top[start:end]
    )
