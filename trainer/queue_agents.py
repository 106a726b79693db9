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

import abc
import asyncio
import copy
import logging
import operator
import sys
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from trainer.llm_api import GenerationHyperparameters, LLMRequest, LLMResponse
from trainer.rewards import math_answer_correct
from trainer.rollout import Episode, EpisodeRunner
from trainer.rollout_engine import RolloutEngine
from trainer.workflow_api import SampleError, sequence_to_sample, split_sequences

__all__ = [
    "Agent",
    "BundledGenerationOutputs",
    "EnvironmentService",
    "MathSingleStepEnv",
    "QueueAgentRunner",
    "RegistryError",
    "import_file",
    "make_agent",
    "make_env",
    "register_agent",
    "register_env",
    "registered_agents",
    "registered_envs",
]

log = logging.getLogger(__name__)


# ---- interfaces ---------------------------------------------------------------------


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


# ---- registries ---------------------------------------------------------------------


class RegistryError(ValueError):
    pass


_AGENTS: dict[str, type] = {}
_ENVS: dict[str, type] = {}


def _same_definition(a: type, b: type) -> bool:
    """The same class imported twice (e.g. one file loaded under two module names)."""
    if a is b:
        return True
    fa = getattr(sys.modules.get(a.__module__), "__file__", None)
    fb = getattr(sys.modules.get(b.__module__), "__file__", None)
    return a.__qualname__ == b.__qualname__ and fa is not None and fa == fb


def _register(table: dict[str, type], kind: str, name: str, cls: type) -> type:
    if not isinstance(name, str) or not name:
        raise RegistryError(f"{kind} name must be a non-empty string, got {name!r}")
    if not isinstance(cls, type):
        raise RegistryError(f"register_{kind}({name!r}, ...) needs a class, got {cls!r}")
    old = table.get(name)
    if old is not None and not _same_definition(old, cls):
        raise RegistryError(
            f"{kind} {name!r} is already registered to {old.__module__}.{old.__qualname__}; "
            f"pick another name for {cls.__module__}.{cls.__qualname__}"
        )
    table[name] = cls
    return cls


def _make(table: dict[str, type], kind: str, name: str, args: dict[str, Any]) -> Any:
    cls = table.get(name)
    if cls is None:
        known = sorted(table) or "none"
        raise RegistryError(
            f"unknown {kind} {name!r}; registered {kind}s: {known} (is the file that "
            f"calls register_{kind} listed under `imports:`?)"
        )
    try:
        return cls(**args)
    except TypeError as exc:
        raise RegistryError(
            f"cannot build {kind} {name!r} ({cls.__name__}(**{args})): {exc}"
        ) from exc


def register_agent(name: str, cls: type) -> type:
    return _register(_AGENTS, "agent", name, cls)


def register_env(name: str, cls: type) -> type:
    return _register(_ENVS, "env", name, cls)


def make_agent(name: str, **args: Any) -> Agent:
    return _make(_AGENTS, "agent", name, args)


def make_env(name: str, **args: Any) -> EnvironmentService:
    return _make(_ENVS, "env", name, args)


def registered_agents() -> list[str]:
    return sorted(_AGENTS)


def registered_envs() -> list[str]:
    return sorted(_ENVS)


def import_file(path: str | Path) -> ModuleType:
    """Import a Python file by path, once (what the config's `imports:` does).

    The same loader as "path/file.py:Class" specs, so a file named both in `imports:`
    and in a spec is one module.
    """
    from trainer.workflow import _load_file_module

    return _load_file_module(str(path))


# ---- the built-in math environment --------------------------------------------------


class MathSingleStepEnv(EnvironmentService):
    """Scores final answers against the reference with math-verify.

    The reference is found by qid (the part before any "@"): tell the env at the start
    of an episode with `await env.reset(options={"qid": qid, "answer": answer})`, or build
    it with `answers={qid: answer, ...}`. `step((qid, [text, ...]))` returns
    `(None, [1.0 or 0.0 per text], True, False, {})`; `step((qid, texts, answer))` scores
    against `answer` directly.
    """

    def __init__(self, answers: dict[str, Any] | None = None, max_tracked: int = 65536) -> None:
        self._answers: OrderedDict[str, str] = OrderedDict(
            (str(k), str(v)) for k, v in (answers or {}).items()
        )
        self.max_tracked = max_tracked

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        options = options or {}
        if "qid" in options and "answer" in options:
            qid = str(options["qid"]).split("@")[0]
            self._answers[qid] = str(options["answer"])
            self._answers.move_to_end(qid)
            while len(self._answers) > self.max_tracked:
                self._answers.popitem(last=False)
        return None, {}

    async def step(self, action: Any) -> tuple[Any, list[float], bool, bool, dict[str, Any]]:
        if not isinstance(action, (tuple, list)) or len(action) not in (2, 3):
            raise ValueError(
                f"math-single-step expects (qid, answers[, reference]), got {action!r}"
            )
        qid, answers = str(action[0]), action[1]
        if isinstance(answers, str):
            answers = [answers]
        if len(action) == 3:
            reference = str(action[2])
        else:
            reference = self._answers.get(qid.split("@")[0])
            if reference is None:
                raise ValueError(
                    f"math-single-step: no reference answer for qid {qid!r}; call "
                    "env.reset(options={'qid': ..., 'answer': ...}) first"
                )
        rewards = await asyncio.to_thread(
            lambda: [1.0 if math_answer_correct(str(a), reference) else 0.0 for a in answers]
        )
        return None, rewards, True, False, {}


register_env("math-single-step", MathSingleStepEnv)


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
