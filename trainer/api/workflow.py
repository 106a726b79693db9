"""The two shapes of user code that plays episodes: an agent and a rollout workflow.

An **agent** (`AgentWorkflow`) is any class with `async def run(self, data, **extra_kwargs)`:
it talks to the gateway through an OpenAI or Anthropic client pointed at its own session
(see `run`), and returns its reward (a number for the
session's last completion, or `{completion_id: reward}`). No base class is needed.

A **rollout workflow** (`RolloutWorkflow`) works in token ids: `arun_episode(engine, data)`
calls `engine.agenerate(LLMRequest(...))` (trainer/api/io_struct.py), each call recorded
in the episode's session of the gateway's store, and returns the sequences to train and
their rewards, as a dict of tensors:

    input_ids       (1, L) or (L,) ints                        required
    loss_mask       (1, L) 1 where the token is trained        required
    rewards         a float, a (1,) tensor, or (1, L) per token   required ("reward" too)
    logprobs        (1, L) behaviour logprob of each token       optional (the recorded
    versions        (1, L) policy version of each token          optional  ones are trained)
    attention_mask  (1, L) 0 on padding                          optional
    ... any other numeric key goes into the training batch too (Episode.raw).

A batch dimension B > 1 (several sequences from one episode, right- or left-padded, with
an `attention_mask`) is accepted too; every row is one sequence. A `TensorDict` (or
anything with `.items()`) works like a dict. Returning None discards the episode: no
samples, no error. Trained tokens must be whole outputs `agenerate` gave, after the
prompt they were given; each sequence's reward goes onto the last of them, and the
samples are the session's export, as for an agent (trainer/rollout/token_episodes.py).

Either one is named by the config's `workflow:` ("module.Class" or "file.py:Class") and
built with `workflow_kwargs`.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from trainer.rollout.engine import RolloutEngine


@runtime_checkable
class AgentWorkflow(Protocol):
    """An agent: one episode per call, against the gateway (`rollout.agent.mode` says
    where it runs: inline, a process pool, or Ray tasks)."""

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float | dict[str, float]:
        """Play one episode for the dataset row `data` and return its reward. Inline,
        `extra_kwargs` hold this episode's session: `base_url`, `api_key`, `http_client`;
        in a subproc worker they are empty and OPENAI_BASE_URL / OPENAI_API_KEY are set."""
        ...


class RolloutWorkflow(abc.ABC):
    """Subclass and implement `arun_episode`; constructor args come from `workflow_kwargs`.

    Give the instance a `gconfig` (GenerationHyperparameters) attribute: where two
    generations hold the same tokens (a sampled and a greedy answer that agree), the one
    sampled at its temperature is the one a returned sequence trains.
    """

    @abc.abstractmethod
    async def arun_episode(self, engine: RolloutEngine, data: dict[str, Any]) -> Any:
        """One episode for one dataset row: a dict of tensors (see module doc) or None."""
