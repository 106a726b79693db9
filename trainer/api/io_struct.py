"""Token-level request/response types for workflows that call the engine directly.

A `RolloutWorkflow` (trainer/api/workflow.py) or a queue agent (trainer/rollout/queue_agents.py)
does not go through the OpenAI gateway: it sends token ids with an `LLMRequest` and gets
back an `LLMResponse` with the output tokens, the behaviour logprob and the policy version
of every output token. The names follow the interface users' existing workflows are
written against (`gconfig.n_samples`, `gconfig.new(greedy=True)`, `resp.output_tokens`,
...).
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.inference.base import SamplingParams

__all__ = ["GenerationHyperparameters", "LLMRequest", "LLMResponse"]


@dataclass
class GenerationHyperparameters:
    """How to sample. `greedy=True` (or `temperature=0`) takes the arg-max token.

    `n_samples` is how many completions a workflow asks for per prompt: the queue-agent
    driver honours it (one bundled answer of n completions), while a single
    `RolloutEngine.agenerate` call always makes exactly one completion.
    """

    n_samples: int = 1
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if int(self.n_samples) < 1:
            raise ValueError(f"n_samples must be >= 1, got {self.n_samples}")
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if float(self.temperature) < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < float(self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]

    def new(self, **changes: Any) -> GenerationHyperparameters:
        """A copy with some fields changed, e.g. `gconfig.new(greedy=True)`."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"GenerationHyperparameters has no field(s) {unknown}")
        return dataclasses.replace(copy.deepcopy(self), **changes)

    @classmethod
    def coerce(
        cls,
        value: GenerationHyperparameters | dict[str, Any] | None,
        stop_token_ids: list[int] | None = None,
    ) -> GenerationHyperparameters:
        """Accept an instance, a dict of fields (from YAML) or None (the defaults);
        `stop_token_ids` (a tokenizer's turn enders) stand in when it names none."""
        if value is None:
            value = cls()
        if isinstance(value, cls):
            no_stops = stop_token_ids and not value.stop_token_ids
            return value.new(stop_token_ids=stop_token_ids) if no_stops else value
        if isinstance(value, dict):
            try:
                return cls.coerce(cls(**value), stop_token_ids)
            except TypeError as exc:
                known = [f.name for f in dataclasses.fields(cls)]
                raise TypeError(f"bad gconfig {value!r}: {exc}; known fields: {known}") from None
        raise TypeError(f"gconfig must be a GenerationHyperparameters or a dict, got {value!r}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature <= 0

    @property
    def behaviour_temperature(self) -> float:
        """The temperature the recorded logprobs are taken at (raw logits when greedy)."""
        return 1.0 if self.is_greedy else float(self.temperature)

    def to_sampling_params(self, max_new_tokens: int | None = None) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=int(
                max_new_tokens if max_new_tokens is not None else self.max_new_tokens
            ),
            temperature=0.0 if self.is_greedy else float(self.temperature),
            top_p=1.0 if self.is_greedy else float(self.top_p),
            stop_token_ids=list(self.stop_token_ids),
            seed=self.seed,
        )


@dataclass
class LLMRequest:
    """One completion of `input_ids`. `rid` keeps requests of one conversation together
    (engines that route across servers may use it to keep them on one server)."""

    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    input_ids: list[int] = field(default_factory=list)
    gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class LLMResponse:
    """What the engine made: output tokens with their behaviour logprobs and versions.

    `stop_reason` is "stop" (a stop token ended it; the token is the last output token),
    "length" (max_new_tokens reached) or "abort".
    """

    input_tokens: list[int]
    output_tokens: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    stop_reason: str
    latency: float = 0.0  # seconds queued + generating

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)
