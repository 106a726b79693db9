"""Running token-level workflows (`RolloutWorkflow.arun_episode(engine, data)`, whose
contract and return format are in trainer/api/workflow.py) for the trainer.

`TokenWorkflowRunner` runs the workflow `group_size` times per dataset row, each run in a
session of the gateway's store that records every `engine.agenerate`. What the workflow
returns becomes rewards on those generations, and the episode's samples are the
session's export (trainer/rollout/token_episodes.py), as for an HTTP agent.
"""

from __future__ import annotations

from typing import Any

from trainer.api.io_struct import GenerationHyperparameters
from trainer.api.workflow import RolloutWorkflow
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.token_episodes import RecordedEpisodeRunner, Returned, returned_sequences

__all__ = ["TokenWorkflowRunner", "workflow_temperature"]


def workflow_temperature(obj: Any) -> float | None:
    """The sampling temperature of `obj.gconfig` (1.0 when greedy; None when absent)."""
    gconfig = getattr(obj, "gconfig", None)
    if isinstance(gconfig, dict):
        gconfig = GenerationHyperparameters.coerce(gconfig)
    if isinstance(gconfig, GenerationHyperparameters):
        return gconfig.behaviour_temperature
    return None


class TokenWorkflowRunner(RecordedEpisodeRunner):
    """Runs a `RolloutWorkflow` for the trainer: `await run_group(data, group, group_size)`."""

    kind = "workflow"
    malformed = "malformed arun_episode output"

    def __init__(self, workflow: RolloutWorkflow, engine: RolloutEngine, **kwargs: Any) -> None:
        """`kwargs`: `export_style`, `turn_discount`, `max_concurrent`."""
        if not callable(getattr(workflow, "arun_episode", None)):
            raise TypeError(f"{type(workflow).__name__} has no `async def arun_episode`")
        self.workflow = workflow
        super().__init__(engine, **kwargs)

    async def play(self, engine: RolloutEngine, data: dict[str, Any]) -> tuple[Any, float | None]:
        out = await self.workflow.arun_episode(engine, data)
        return out, workflow_temperature(self.workflow)

    def sequences(self, out: Any) -> list[Returned] | None:
        return None if out is None else returned_sequences(out)
