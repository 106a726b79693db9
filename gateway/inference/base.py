"""The one interface every inference engine implements.

The gateway speaks token ids to engines, never text: what an engine returns is exactly
what the trainer will later learn from.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]
# The most likely tokens at one output position, best first: (token id, logprob).
TopLogprobs = list[tuple[int, float]]


class EngineError(RuntimeError):
    """The engine could not serve a request (dead, overloaded, or refused it)."""


class ContextLengthExceeded(ValueError):
    """The prompt plus the requested completion does not fit the model's context."""

    def __init__(self, prompt_tokens: int, max_context: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_context} tokens, "
            f"but the prompt has {prompt_tokens} tokens."
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    # How many alternatives to return per output token (0 = none), from the same
    # distribution the sampled token's logprob is taken from.
    top_logprobs: int = 0


@dataclass(slots=True)
class TokenChunk:
    """Tokens produced by one engine step for one request (used for streaming)."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    top_logprobs: list[TopLogprobs] | None = None  # one list per token when asked for


@dataclass(slots=True)
class GenerationResult:
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    # Seconds spent queued before the first engine step, and generating.
    queue_s: float = 0.0
    gen_s: float = 0.0
    top_logprobs: list[TopLogprobs] | None = None  # one list per token when asked for


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """New policy weights for an engine: a Hugging Face folder, or tensors in memory.

    The trainer sends whichever the engine's registry entry asks for (`weights`):
    an in-process engine takes the state dict, a server loads the folder.
    """

    version: int
    path: str | None = None
    state_dict: Mapping[str, Any] | None = None


class InferenceEngine(abc.ABC):
    """Async token-in/token-out generation with versioned weights."""

    name: str = "engine"

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Policy version of the weights currently serving."""

    @property
    @abc.abstractmethod
    def max_context(self) -> int:
        """Largest prompt + completion length, in tokens."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load weights / open connections; called once by the gateway on startup."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called once on shutdown."""

    def forget_route(self, route_key: str) -> None:  # noqa: B027 - optional hook
        """The conversation `route_key` named has ended: no server need be kept for it."""

    @abc.abstractmethod
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> GenerationResult:
        """Generate one completion for a prompt given as token ids.

        `route_key` (the gateway passes the session id) lets an engine with several
        servers keep one conversation on one server, where its prefix is cached.
        """

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """Yield chunks as tokens are made, then the final result.

        Engines that cannot stream fall back to one chunk at the end.
        """
        result = await self.generate(prompt_ids, params, route_key=route_key)
        yield TokenChunk(result.output_ids, result.logprobs, result.versions, result.top_logprobs)
        yield result

    async def update_weights(self, update: WeightUpdate) -> int:
        """Serve the new weights from now on; return the new policy version."""
        if update.path is None:
            raise EngineError(f"the {self.name!r} engine loads new weights from a folder")
        return await self.update_weights_from_disk(update.path, update.version)

    async def update_weights_from_disk(self, path: str, version: int | None = None) -> int:
        """Load new weights from a Hugging Face checkpoint folder; return the new version.

        `version` defaults to the current version + 1. Tokens generated after this
        returns carry the new version; a generation in flight keeps the old version on
        the tokens made before the update and the new one on the tokens made after.
        """
        raise NotImplementedError(
            f"the {self.name!r} engine cannot load weights from disk "
            "(use the embedded or sglang engine)"
        )

    @abc.abstractmethod
    async def health(self) -> bool:
        """True when the engine can take requests."""

    def check_fits(self, prompt_len: int, max_new_tokens: int) -> int:
        """Raise if the prompt cannot fit; return the max new tokens that do fit."""
        if prompt_len >= self.max_context:
            raise ContextLengthExceeded(prompt_len, self.max_context)
        return min(max_new_tokens, self.max_context - prompt_len)
