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
    logprobs    behaviour logprob of each token (0.0 where not generated)
    versions    policy version of each token (-1 where not generated)
    reward      float: the trajectory's return (or `rewards`, one per token: the
                value at the last trained token counts)
    temperature optional float; by default the temperature the driver sampled at

Each `collect_trajectory` call is one `Episode`; all the trajectories it returns are in
that episode's group (GRPO compares them: e.g. the n_samples answers to one prompt).
Other keys are kept in `Episode.raw`.

Several observations may be in flight at once (e.g. one per trajectory, each with its
own qid like "q@3"); answers arrive on `act_queue` in completion order, so match them by
`qid`. Agents and environments are found by name: `register_agent` / `register_env`,
then `make_agent(name, **args)` / `make_env(name, **args)` (the `agent:` and `env:`
sections of the trainer config).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import operator
import uuid
from typing import Any

from trainer.api.agent import Agent, BundledGenerationOutputs, EnvironmentService
from trainer.api.io_struct import GenerationHyperparameters, LLMRequest
from trainer.rollout.agent_runner import Episode, EpisodeRunner
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.workflow import SampleError, sequence_to_sample, split_sequences

__all__ = ["QueueAgentRunner"]

log = logging.getLogger(__name__)


# ---- the driver ---------------------------------------------------------------------


class QueueAgentRunner(EpisodeRunner):
    """Runs a queue agent for the trainer: `await run_group(data, group, group_size)`.

    For every run: two fresh queues, the agent's `collect_trajectory`, and a driver that
    serves each observation with `gconfig.n_samples` concurrent `agenerate` calls. When
    the agent returns or raises (or a generation fails, or `episode_timeout_s` passes)
    everything of that run is cancelled and awaited: nothing is left running.
    """

    def __init__(
        self,
        agent: Agent,
        env: EnvironmentService,
        engine: RolloutEngine,
        max_concurrent: int = 64,
        episode_timeout_s: float | None = None,
    ) -> None:
        if not callable(getattr(agent, "collect_trajectory", None)):
            raise TypeError(f"{type(agent).__name__} has no `async def collect_trajectory`")
        self.agent = agent
        self.env = env
        self.engine = engine
        self.episode_timeout_s = episode_timeout_s
        super().__init__(max_concurrent)

    async def run_episode(self, data: dict[str, Any], group: int) -> Episode:
        async with self._sem:
            qid = uuid.uuid4().hex[:16]
            ep = Episode(group=group, session_id=f"agent-{qid}")
            prompt = copy.deepcopy(dict(data))
            prompt["qid"] = qid
            engine = self.engine.fork()
            # recorded in the gateway's store when the trainer gave the engine a recorder
            ep.session_id = await engine.open_episode({"group": group, "kind": "queue-agent"}) or (
                ep.session_id
            )
            start_version = engine.version
            temperatures: set[float] = set()
            try:
                trajectories = await self._play(prompt, engine, temperatures)
            except Exception as exc:  # the agent's bug must not kill training
                ep.error = f"{type(exc).__name__}: {exc}"
                log.warning("queue agent episode %s failed: %s", ep.session_id, ep.error)
                return ep
            finally:
                ep.num_completions = engine.num_requests
                await engine.close_episode()
            try:
                samples, raws = self._samples(trajectories, temperatures, start_version)
            except SampleError as exc:
                ep.error = f"malformed trajectory: {exc}"
                log.warning("queue agent episode %s: %s", ep.session_id, ep.error)
                return ep
            for s in samples:
                s["session_id"] = ep.session_id
            ep.samples, ep.raw = samples, raws
            if samples:
                ep.reward = sum(s["returns"] for s in samples) / len(samples)
            return ep

    async def _play(
        self, prompt: dict[str, Any], engine: RolloutEngine, temperatures: set[float]
    ) -> Any:
        obs_queue: asyncio.Queue = asyncio.Queue()
        act_queue: asyncio.Queue = asyncio.Queue()
        failed: asyncio.Future = asyncio.get_running_loop().create_future()
        agent_task = asyncio.ensure_future(
            self.agent.collect_trajectory(prompt, self.env, obs_queue, act_queue)
        )
        driver = asyncio.ensure_future(
            self._drive(obs_queue, act_queue, engine, failed, temperatures)
        )
        try:
            done, _ = await asyncio.wait(
                {agent_task, failed},
                timeout=self.episode_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if agent_task in done:
                return agent_task.result()
            if failed in done:
                raise failed.exception()  # type: ignore[misc]
            raise TimeoutError(f"episode took longer than {self.episode_timeout_s} s")
        finally:
            for task in (agent_task, driver):
                task.cancel()
            await asyncio.gather(agent_task, driver, return_exceptions=True)
            if not failed.done():
                failed.cancel()
            elif not failed.cancelled():
                failed.exception()  # retrieved: no "never retrieved" warning

    async def _drive(
        self,
        obs_queue: asyncio.Queue,
        act_queue: asyncio.Queue,
        engine: RolloutEngine,
        failed: asyncio.Future,
        temperatures: set[float],
    ) -> None:
        tasks: set[asyncio.Task] = set()

        def fail(exc: BaseException) -> None:
            if not failed.done():
                failed.set_exception(exc)

        def finished(task: asyncio.Task) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                fail(task.exception())  # type: ignore[arg-type]

        try:
            while True:
                item = await obs_queue.get()
                try:
                    qid, token_ids, gconfig = _parse_observation(item)
                except (TypeError, ValueError) as exc:
                    fail(exc)
                    return
                temperatures.add(gconfig.behaviour_temperature)
                task = asyncio.ensure_future(
                    self._serve(qid, token_ids, gconfig, act_queue, engine)
                )
                tasks.add(task)
                task.add_done_callback(finished)
        finally:
            pending = list(tasks)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

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

    @staticmethod
    def _samples(
        trajectories: Any, temperatures: set[float], start_version: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if hasattr(trajectories, "items"):  # one trajectory (or a batch) as a dict
            trajectories = [trajectories]
        if not isinstance(trajectories, (list, tuple)):
            raise SampleError(
                f"collect_trajectory must return a list of trajectory dicts, got "
                f"{type(trajectories).__name__}"
            )
        samples: list[dict[str, Any]] = []
        raws: list[dict[str, Any]] = []
        for i, traj in enumerate(trajectories):
            try:
                seqs = split_sequences(traj)
                for seq in seqs:
                    if "temperature" not in seq and len(temperatures) > 1:
                        raise SampleError(
                            f"the episode sampled at several temperatures {sorted(temperatures)}; "
                            "give each trajectory its 'temperature'"
                        )
                    temp = next(iter(temperatures)) if temperatures else 1.0
                    samples.append(
                        sequence_to_sample(seq, temperature=temp, fallback_version=start_version)
                    )
                    raws.append(seq)
            except SampleError as exc:
                raise SampleError(f"trajectory {i}: {exc}") from None
        return samples, raws


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
