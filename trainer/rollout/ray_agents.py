"""`rollout.agent.mode: ray`: each episode's `run(data, **extra_kwargs)` as a Ray task.

Agents are placed by Ray, on whatever node has the resources a run asks for
(`rollout.agent.num_cpus`, `rollout.agent.resources`), so hundreds of them can spread
over a cluster of CPU machines while the gateway and trainer stay put. A task gets the
same arguments an inline run does, less the shared `http_client` (a client cannot cross
processes): `base_url` and `api_key` as keyword arguments, and the same two in
`OPENAI_BASE_URL` / `OPENAI_API_KEY` for agents that read the environment (a Ray worker
runs one task at a time, so that is safe). Its return value comes back as is.

A task whose worker or node died raises `AgentWorkerDied`: the runner ends that session
and runs the episode again in a new one, up to `rollout.agent.max_retries` times, so an
episode is never recorded twice. An exception of the agent's own comes back as itself
and fails only its episode, as inline.

Ray is optional (`pip install turnstile-rl[ray]`): only this mode imports it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from trainer.loading import WorkflowError
from trainer.rollout.subproc import ENV_KEYS, FILE_MODULE_PREFIX, SubprocWorkerDied

__all__ = ["AgentWorkerDied", "RayAgentPool", "connect"]

# Ray's own telemetry: off before anything imports ray (rule: nothing leaves the machine)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


class AgentWorkerDied(SubprocWorkerDied):
    """The process or node running the agent died before it answered: the episode may be
    run again, in a new session."""


_started_here = False  # a local cluster this process started (and stops when done)


def connect(address: str | None, namespace: str = "turnstile") -> Any:
    """Join the Ray cluster at `address` ("auto", "host:6379", "ray://host:10001"), or
    start a small local one when it is None and no RAY_ADDRESS is set. Returns `ray`."""
    try:
        import ray
    except ImportError:
        raise WorkflowError(
            "rollout.agent.mode: ray needs Ray: pip install 'turnstile-rl[ray]'"
        ) from None
    if not ray.is_initialized():
        global _started_here
        local = address is None and not os.environ.get("RAY_ADDRESS")
        _started_here = local
        ray.init(
            address=address,
            namespace=namespace,
            include_dashboard=False,
            log_to_driver=True,
            # a local cluster for agents only: small, and gone with the trainer
            **({"num_cpus": os.cpu_count(), "object_store_memory": 100 * 2**20} if local else {}),
        )
    return ray


def _run_task(agent: Any, data: dict[str, Any], base_url: str, api_key: str) -> Any:
    """Runs inside a Ray worker: the agent's coroutine, to completion."""
    os.environ.update(dict(zip(ENV_KEYS, (base_url, api_key), strict=True)))
    return asyncio.run(agent.run(data, base_url=base_url, api_key=api_key))


class RayAgentPool:
    """Ray tasks that run the agent; `run` awaits one without blocking the event loop."""

    def __init__(
        self,
        address: str | None = None,
        num_cpus: float = 1.0,
        resources: dict[str, float] | None = None,
    ) -> None:
        self.ray = connect(address)
        # classes from "path/file.py:Class" live in generated modules a worker cannot
        # import: ship them by value
        for name, module in list(sys.modules.items()):
            if name.startswith(FILE_MODULE_PREFIX):
                self.ray.cloudpickle.register_pickle_by_value(module)
        self._task = self.ray.remote(_run_task).options(
            num_cpus=num_cpus, resources=dict(resources or {}), max_retries=0
        )

    async def run(self, agent: Any, data: dict[str, Any], *, base_url: str, api_key: str) -> Any:
        from ray import exceptions

        ref = self._task.remote(agent, data, base_url, api_key)
        try:
            return await asyncio.wrap_future(ref.future())
        except exceptions.RayTaskError as exc:  # the agent's own exception
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            raise cause from None
        except (exceptions.WorkerCrashedError, exceptions.NodeDiedError,
                exceptions.ObjectLostError, exceptions.RaySystemError) as exc:  # fmt: skip
            raise AgentWorkerDied(f"Ray worker died: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Stop the local cluster this process started; a cluster joined by address
        outlives the run."""
        global _started_here
        if _started_here and self.ray.is_initialized():
            self.ray.shutdown()
            _started_here = False
