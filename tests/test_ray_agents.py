"""`rollout.agent.mode: ray`: each episode's `run` is a Ray task on a real (local) Ray
cluster, against a real gateway with the fake engine (it answers "The answer is 4.").
A dead worker's episode runs again in a new session; nothing is recorded twice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_helpers import ADMIN_KEY, list_sessions
from subproc_agents import read_reports

from trainer.api.config import AgentConfig
from trainer.loading import make_workflow
from trainer.rollout.agent_runner import AgentRunner
from trainer.rollout.gateways import GatewayAdmin

ray = pytest.importorskip("ray", reason="Ray is the optional extra turnstile-rl[ray]")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
AGENTS = f"{REPO / 'tests' / 'subproc_agents.py'}"
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local one-node cluster with a custom resource some agents ask for."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(
        num_cpus=2, resources={"sandbox": 1}, include_dashboard=False,
        object_store_memory=100 * 2**20, namespace="turnstile-test",
    )  # fmt: skip
    yield ray
    ray.shutdown()


def _runner(gw: Any, http: httpx.AsyncClient, tmp_path: Path, **kw: Any) -> AgentRunner:
    agent = make_workflow(f"{AGENTS}:ReportingSyncAgent", {"report_dir": str(tmp_path)})
    gateway = GatewayAdmin(gw.url, ADMIN_KEY, http)
    return AgentRunner(
        [gateway], agent, placement=AgentConfig(mode="ray", **{"max_retries": 0, **kw})
    )


async def test_an_agent_loaded_by_path_runs_as_a_ray_task_with_the_inline_arguments(
    cluster, gateway_factory, tmp_path
) -> None:
    gw = gateway_factory()
    data = {"messages": QUESTION, "answer": "4", "reward": 0.5, "tag": "ok"}
    async with httpx.AsyncClient(timeout=120) as http:
        runner = _runner(gw, http, tmp_path, resources={"sandbox": 1})
        episodes = await runner.run_group(data, group=1, group_size=2)
        views = {ep.session_id: await GatewayAdmin(gw.url, ADMIN_KEY, http).session(ep.session_id)
                 for ep in episodes}  # fmt: skip
    reports = {r["completion_id"]: r for r in read_reports(tmp_path)}
    assert len(reports) == 2
    for ep in episodes:
        assert ep.error is None and ep.reward == 0.5 and ep.retries == 0
        (completion,) = views[ep.session_id]["completions"]
        report = reports[completion["id"]]
        # another process; the session's own URL and key, as keyword arguments and env
        assert report["pid"] != os.getpid()
        assert report["extra_kwargs"] == ["api_key", "base_url"]
        assert report["base_url"] == gw.url and report["api_key"].startswith("tsk-")
        assert ep.samples and ep.num_completions == 1


async def test_an_agent_exception_fails_only_its_episode_and_is_not_retried(
    cluster, gateway_factory, tmp_path
) -> None:
    gw = gateway_factory()
    async with httpx.AsyncClient(timeout=120) as http:
        runner = _runner(gw, http, tmp_path, max_retries=2)
        ep = await runner.run_episode({"behave": "raise", "tag": "t1"}, group=0)
        sessions = await list_sessions(gw, http)
    assert ep.error == "ValueError: agent failed on purpose (t1)"
    assert ep.retries == 0 and not ep.worker_died
    assert len(sessions) == 1 and sessions[0]["ended_at"] is not None


async def test_a_dead_worker_runs_the_episode_again_in_a_new_session(
    cluster, gateway_factory, tmp_path
) -> None:
    gw = gateway_factory()
    data = {"messages": QUESTION, "answer": "4", "tag": "once", "behave": "exit_once"}
    async with httpx.AsyncClient(timeout=120) as http:
        runner = _runner(gw, http, tmp_path, max_retries=1)
        ep = await runner.run_episode(data, group=0)
        sessions = await list_sessions(gw, http)
        admin = GatewayAdmin(gw.url, ADMIN_KEY, http)
        views = [await admin.session(s["id"]) for s in sessions]
        # with no retries left, the death is the episode's error
        (tmp_path / "died-never").touch()
        dead = await _runner(gw, http, tmp_path, max_retries=0).run_episode(
            {"behave": "exit", "tag": "x"}, group=1
        )
    assert ep.error is None and ep.reward == 1.0 and ep.retries == 1
    assert len(sessions) == 2 and all(s["ended_at"] is not None for s in sessions)
    # the dead run's session holds nothing; the episode was recorded once, in the new one
    assert sorted(len(v["completions"]) for v in views) == [0, 1]
    assert [r["tag"] for r in read_reports(tmp_path)] == ["once"]
    assert dead.worker_died and "AgentWorkerDied" in dead.error and dead.retries == 0
