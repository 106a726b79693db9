"""The queue-based agent API: the agent, its environment, and the answers it is sent.

The agent never calls the engine: it puts `(qid, token_ids, gconfig)` on `obs_queue` and
gets one `BundledGenerationOutputs` per observation back on `act_queue`
(trainer/rollout/queue_agents.py drives it). Register both by name in
trainer/api/registry.py (`register_agent`, `register_env`).
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from typing import Any

from trainer.api.io_struct import LLMResponse


class EnvironmentService(abc.ABC):
    """An async gym-style environment. One instance serves all concurrent episodes."""

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        """Start an episode; returns (observation, info)."""
        return None, {}

    @abc.abstractmethod
    async def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Returns (observation, reward, terminated, truncated, info)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass


class Agent(abc.ABC):
    @abc.abstractmethod
    async def collect_trajectory(
        self,
        prompt: dict[str, Any],
        env: EnvironmentService,
        obs_queue: asyncio.Queue,
        act_queue: asyncio.Queue,
    ) -> list[dict[str, Any]]:
        """Play one episode for the dataset row `prompt` (it has a unique "qid")."""


@dataclass
class BundledGenerationOutputs:
    """The n completions of one observation, index i = sample i.

    `logprobs[i]` and `versions[i]` are aligned with `output_ids[i]` (output tokens only);
    `seqs[i]` is prompt_ids + output_ids[i]; `no_eos[i]` is True when sample i stopped
    for length rather than on a stop token (its last token is then not a stop token).
    """

    qid: str
    prompt_ids: list[int]
    output_ids: list[list[int]]
    logprobs: list[list[float]]
    versions: list[list[int]]
    no_eos: list[bool]
    seqs: list[list[int]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)

    @classmethod
    def from_responses(
        cls, qid: str, prompt_ids: list[int], responses: list[LLMResponse]
    ) -> BundledGenerationOutputs:
        return cls(
            qid=qid,
            prompt_ids=list(prompt_ids),
            output_ids=[list(r.output_tokens) for r in responses],
            logprobs=[list(r.output_logprobs) for r in responses],
            versions=[list(r.output_versions) for r in responses],
            no_eos=[r.stop_reason != "stop" for r in responses],
            seqs=[list(prompt_ids) + list(r.output_tokens) for r in responses],
            finish_reasons=[r.stop_reason for r in responses],
        )

    @property
    def n(self) -> int:
        return len(self.output_ids)

    @property
    def output_lens(self) -> list[int]:
        return [len(o) for o in self.output_ids]

    @property
    def version_start(self) -> list[int]:
        return [v[0] if v else -1 for v in self.versions]

    @property
    def version_end(self) -> list[int]:
        return [v[-1] if v else -1 for v in self.versions]
