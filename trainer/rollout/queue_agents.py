"""Queue-based agents: `collect_trajectory(prompt, env, obs_queue, act_queue)`.

This is the agent API where the agent never calls the engine itself. It puts an
observation `(qid, token_ids, gconfig)` on `obs_queue`; a driver generates
`gconfig.n_samples` completions of `token_ids` and puts one `BundledGenerationOutputs`
with all of them on `act_queue`. The agent scores what came back with an environment
(`EnvironmentService`, gym-style but async), extends the token ids (feedback, tool
output, ...) and goes again, and finally returns its trajectories.

A trajectory is a dict (lists or 1-D tensors, all aligned with `input_ids`):

    input_ids   prompt, outputs and everything in between, as the model saw them
    loss_mask   1 on tokens the policy generated and should learn from, else 0
    reward      float: the trajectory's return (or `rewards`, one per token: the
                value at the last trained token counts)
    logprobs, versions, temperature   optional (the recorded ones are trained on)

Each `collect_trajectory` call is one `Episode` in a session of the gateway's store, where
every generation the driver made is recorded; all the trajectories it returns are in
that episode's group (GRPO compares them: e.g. the n_samples answers to one prompt).
Each trajectory's runs of trained tokens must be whole outputs the driver sent back;
its reward goes onto its last generation, and the samples are the session's export
under `rollout.agent.export_style` and `turn_discount` (`concat` trains a multi-turn
trajectory as the one sequence it returned; trainer/rollout/token_episodes.py). Other
keys are kept in `Episode.raw`.

Several observations may be in flight at once (e.g. one per trajectory, each with its
own qid like "q@3"); answers arrive on `act_queue` in completion order, so match them by
`qid`. Agents and environments are found by name: `register_agent` / `register_env`,
then `make_agent(name, **args)` / `make_env(name, **args)` (the `agent:` and `env:`
sections of the trainer config).
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from typing import Any

from trainer.api.agent import Agent, BundledGenerationOutputs, EnvironmentService
from trainer.api.io_struct import GenerationHyperparameters, LLMRequest
from trainer.backend.batches import SampleError
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.token_episodes import RecordedEpisodeRunner, Returned, returned_sequences

__all__ = ["QueueAgentRunner"]


# ---- the driver ---------------------------------------------------------------------


class QueueAgentRunner(RecordedEpisodeRunner):
    """Runs a queue agent for the trainer: `await run_group(data, group, group_size)`.

    For every run: two fresh queues, the agent's `collect_trajectory`, and a driver that
    serves each observation with `gconfig.n_samples` concurrent `agenerate` calls (each
    recorded in the episode's session). When the agent returns or raises (or a
    generation fails, or `episode_timeout_s` passes) everything of that run is cancelled
    and awaited: nothing is left running. The trajectories it returns become rewards on
    the recorded generations; its samples are the session's export
    (trainer/rollout/token_episodes.py).
    """

    kind = "queue-agent"
    malformed = "malformed trajectory"

    def __init__(
        self,
        agent: Agent,
        env: EnvironmentService,
        engine: RolloutEngine,
        episode_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        """`kwargs`: `export_style`, `turn_discount`, `max_concurrent`."""
        if not callable(getattr(agent, "collect_trajectory", None)):
            raise TypeError(f"{type(agent).__name__} has no `async def collect_trajectory`")
        self.agent = agent
        self.env = env
        self.episode_timeout_s = episode_timeout_s
        super().__init__(engine, **kwargs)

    def sequences(self, out: Any) -> list[Returned]:
        if hasattr(out, "items"):  # one trajectory (or a batch) as a dict
            out = [out]
        if not isinstance(out, (list, tuple)):
            raise SampleError(
                f"collect_trajectory must return a list of trajectory dicts, got "
                f"{type(out).__name__}"
            )
        seqs: list[Returned] = []
        for i, traj in enumerate(out):
            try:
                seqs += returned_sequences(traj)
            except SampleError as exc:
                raise SampleError(f"trajectory {i}: {exc}") from None
        return seqs

    async def play(self, engine: RolloutEngine, data: dict[str, Any]) -> tuple[Any, float | None]:
        prompt = {**data, "qid": uuid.uuid4().hex[:16]}
        temperatures: set[float] = set()
        obs_queue: asyncio.Queue = asyncio.Queue()
        act_queue: asyncio.Queue = asyncio.Queue()
        agent_task = asyncio.ensure_future(
            self.agent.collect_trajectory(prompt, self.env, obs_queue, act_queue)
        )
        driver = asyncio.ensure_future(self._drive(obs_queue, act_queue, engine, temperatures))
        try:
            done, _ = await asyncio.wait(
                {agent_task, driver},
                timeout=self.episode_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if agent_task in done:
                temperature = next(iter(temperatures)) if len(temperatures) == 1 else None
                return agent_task.result(), temperature
            if driver in done:  # it ends only by failing: the task group's first error
                raise driver.exception().exceptions[0]  # type: ignore[union-attr]
            raise TimeoutError(f"episode took longer than {self.episode_timeout_s} s")
        finally:
            for task in (agent_task, driver):
                task.cancel()
            await asyncio.gather(agent_task, driver, return_exceptions=True)

    async def _drive(
        self,
        obs_queue: asyncio.Queue,
        act_queue: asyncio.Queue,
        engine: RolloutEngine,
        temperatures: set[float],
    ) -> None:
        """Serves each observation in a task group: a bad observation or a failed
        generation cancels the others and ends the driver with it; so does cancelling it."""
        async with asyncio.TaskGroup() as serving:
            while True:
                qid, token_ids, gconfig = _parse_observation(await obs_queue.get())
                temperatures.add(gconfig.behaviour_temperature)
                serving.create_task(self._serve(qid, token_ids, gconfig, act_queue, engine))

    @staticmethod
    async def _serve(
        qid: str,
        token_ids: list[int],
        gconfig: GenerationHyperparameters,
        act_queue: asyncio.Queue,
        engine: RolloutEngine,
    ) -> None:
        n = gconfig.n_samples
        requests = []
        for j in range(n):
            seed = None if gconfig.seed is None else gconfig.seed + j
            requests.append(
                LLMRequest(
                    rid=qid if n == 1 else f"{qid}@{j}",
                    input_ids=token_ids,
                    gconfig=gconfig.new(n_samples=1, seed=seed),
                )
            )
        responses = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        await act_queue.put(
            BundledGenerationOutputs.from_responses(qid, token_ids, list(responses))
        )


def _parse_observation(item: Any) -> tuple[str, list[int], GenerationHyperparameters]:
    if not isinstance(item, (tuple, list)) or len(item) != 3:
        raise ValueError(
            f"obs_queue items must be (qid, token_ids, gconfig), got {type(item).__name__}"
        )
    qid, token_ids, gconfig = item
    if hasattr(token_ids, "tolist"):
        token_ids = token_ids.tolist()
    try:
        ids = [operator.index(t) for t in token_ids]
    except TypeError:
        raise ValueError(f"observation {qid!r}: token_ids must be a list of ints") from None
    return str(qid), ids, GenerationHyperparameters.coerce(gconfig)
