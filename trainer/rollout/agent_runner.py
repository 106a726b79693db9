"""Running the user's agent against the gateway and turning each run into samples.

Each agent run gets its own session and key. Whatever `run` returns becomes rewards:
a number goes to the session's last completion, a dict is keyed by completion id.
Runs that crash, return garbage or never get a reward are reported, not trained on.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.reward_values import finite_reward
from trainer.api.config import AgentConfig
from trainer.loading import WorkflowError
from trainer.rollout.gateways import GatewayAdmin, GatewayRequestError
from trainer.rollout.subproc import SubprocAgentPool, SubprocWorkerDied, check_picklable

log = logging.getLogger(__name__)


@dataclass
class Episode:
    group: int
    session_id: str
    reward: float | None = None  # the agent's own return value (float form), if any
    samples: list[dict[str, Any]] = field(default_factory=list)
    num_completions: int = 0
    error: str | None = None
    no_reward: bool = False
    worker_died: bool = False  # the process or node running the agent died (subproc, ray)
    retries: int = 0  # runs of this episode before this one, each in a session ended unused
    # Token-level workflows: the per-sequence tensors `arun_episode` / an agent returned;
    # their numeric keys join the samples' in the training batch (algorithm.to_sequences).
    raw: list[dict[str, Any]] = field(default_factory=list)


class EpisodeRunner:
    """Runs one dataset row `group_size` times at once (a GRPO group).

    Subclasses implement `run_episode` and hold `self._sem` around it, so at most
    `max_concurrent` episodes are in flight across all groups.
    """

    def __init__(self, max_concurrent: int = 64) -> None:
        self._sem = asyncio.Semaphore(max_concurrent)

    async def run_group(self, data: dict[str, Any], group: int, group_size: int) -> list[Episode]:
        return list(
            await asyncio.gather(*(self.run_episode(data, group) for _ in range(group_size)))
        )

    async def run_episode(self, data: dict[str, Any], group: int) -> Episode:
        raise NotImplementedError


class RewardShapeError(ValueError):
    pass


def rewards_from_return(value: Any, completions: list[dict[str, Any]]) -> dict[str, float]:
    """Map `run`'s return value onto this session's completion ids."""
    if not completions:
        return {}
    if isinstance(value, dict):
        known = {c["id"] for c in completions}
        out = {}
        for cid, r in value.items():
            if cid not in known:
                raise RewardShapeError(
                    f"reward for unknown completion id {cid!r} (not in this session)"
                )
            out[cid] = _finite(r, f"reward[{cid}]")
        return out
    if value is None:
        return {}
    last = max(completions, key=lambda c: (c["created_at"], c["id"]))
    return {last["id"]: _finite(value, "reward")}


def described(exc: BaseException) -> str:
    """`Type: message`, and the exception it came from: an SDK's "Connection error." says
    nothing without the transport's own error under it."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None and str(cause) not in text:
        text += f" (from {type(cause).__name__}: {cause})"
    return text


def _finite(value: Any, what: str) -> float:
    number = finite_reward(value)
    if number is None:
        raise RewardShapeError(f"{what} must be a finite float, int or bool; got {value!r}")
    return number


@dataclass(frozen=True)
class SessionSpec:
    """What every session a runner opens carries (metadata, sampling forced on each of its
    requests: an evaluation forces greedy), and how it becomes samples (`export=False`:
    it does not)."""

    metadata: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] | None = None
    export_style: str = "individual"
    turn_discount: float = 1.0
    export: bool = True


class AgentRunner(EpisodeRunner):
    def __init__(
        self,
        gateways: Sequence[GatewayAdmin],
        agent: Any,
        *,
        sessions: SessionSpec = SessionSpec(),
        placement: AgentConfig | None = None,
        ray_address: str | None = None,
        max_concurrent: int = 64,
    ) -> None:
        """`gateways`: the admin client of one gateway, or of several replicas of one store
        (inline agents share their HTTP client); each session sticks to one
        (trainer/rollout/gateways.py), and with several its metadata says which.
        `placement` (`rollout.agent`): where each run happens (inline, a process pool, Ray
        tasks on the `ray_address` cluster) and how often an episode whose worker died runs
        again, each time in a new session."""
        placement = placement or AgentConfig()
        mode = placement.mode
        if mode not in ("inline", "subproc", "ray"):
            raise WorkflowError(
                f"rollout.agent.mode must be 'inline', 'subproc' or 'ray', got {mode!r}"
            )
        if not gateways:
            raise ValueError("AgentRunner needs at least one gateway")
        self.mode = mode
        self.max_retries = placement.max_retries
        self._pool: Any = None
        if mode != "inline" and not inspect.iscoroutinefunction(getattr(agent, "run", None)):
            raise WorkflowError(
                f"rollout.agent.mode: {mode} runs `async def run(self, data, **extra_kwargs)`"
                f" in worker processes; {type(agent).__name__} has none"
            )
        if mode == "subproc":  # fail before any session: the agent must pickle
            check_picklable(agent, "agent")
            self._pool = SubprocAgentPool(placement.subproc_max_workers)  # workers start lazily
        elif mode == "ray":
            from trainer.rollout.ray_agents import RayAgentPool

            self._pool = RayAgentPool(ray_address, placement.num_cpus, placement.resources)
        # round robin: each gateway gets an equal share of sessions, and a session sticks to one
        self.gateways = itertools.cycle(list(gateways))
        self.several_gateways = len(gateways) > 1
        self.agent = agent
        self.sessions = sessions
        super().__init__(max_concurrent)

    async def run_episode(self, data: dict[str, Any], group: int) -> Episode:
        async with self._sem:
            if self.mode == "subproc":
                check_picklable(data, "data")
            for attempt in itertools.count():
                ep = await self._run_once(data, group)
                ep.retries = attempt
                if not ep.worker_died or attempt >= self.max_retries:
                    return ep
                log.warning(
                    "agent worker died in session %s; running the episode again in a new "
                    "session (retry %d of %d)", ep.session_id, attempt + 1, self.max_retries,
                )  # fmt: skip

    async def _run_once(self, data: dict[str, Any], group: int) -> Episode:
        """One run of the agent in a session of its own; a dead worker ends it unused."""
        admin = next(self.gateways)
        base_url = admin.base_url
        metadata = {**self.sessions.metadata, "group": group}
        if self.several_gateways:
            metadata["gateway"] = base_url
        session_id, api_key = await admin.create_session(metadata, self.sessions.sampling)
        ep = Episode(group=group, session_id=session_id)
        try:
            if self._pool is not None:  # a worker process; URL and key via its env
                value = await self._pool.run(self.agent, data, base_url=base_url, api_key=api_key)
            else:
                value = await self.agent.run(
                    copy.deepcopy(data),
                    base_url=base_url,
                    api_key=api_key,
                    http_client=admin.client,
                )
        except Exception as exc:  # the agent's bug must not kill training
            ep.error = described(exc)
            ep.worker_died = isinstance(exc, SubprocWorkerDied)
            log.warning("agent run failed in session %s: %s", session_id, ep.error)
            await self._end_quietly(admin, session_id)
            return ep
        try:
            view = await admin.session(session_id)
            completions = view["completions"]
            ep.num_completions = len(completions)
            rewards = rewards_from_return(value, completions)
            if not isinstance(value, dict) and value is not None:
                ep.reward = _finite(value, "reward")
            elif rewards:
                ep.reward = sum(rewards.values())
            await admin.set_rewards(rewards)
            await admin.end_session(session_id)
            spec = self.sessions
            if not completions or not spec.export:
                return ep
            ep.samples = await admin.export(session_id, spec.export_style, spec.turn_discount)
        except RewardShapeError as exc:
            ep.error = str(exc)
            await self._end_quietly(admin, session_id)
        except GatewayRequestError as exc:
            if "no_reward" in str(exc):
                ep.no_reward = True
            else:
                ep.error = str(exc)
        return ep

    async def close(self) -> None:
        """Stop the subproc workers (if any); the trainer calls this when it is done."""
        if self._pool is not None:
            await asyncio.to_thread(self._pool.close)

    async def _end_quietly(self, admin: GatewayAdmin, session_id: str) -> None:
        try:
            await admin.end_session(session_id)
        except Exception:  # pragma: no cover - best effort
            log.debug("could not end session %s", session_id, exc_info=True)
