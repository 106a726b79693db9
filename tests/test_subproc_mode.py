"""`rollout.agent.mode: subproc`: agents run in spawned worker processes, against a real
gateway with the fake engine (it answers "The answer is 4.")."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_helpers import ADMIN_KEY, list_sessions
from subproc_agents import read_reports

from trainer.api.config import AgentConfig
from trainer.loading import WorkflowError, make_workflow
from trainer.rollout.agent_runner import AgentRunner, Episode
from trainer.rollout.gateways import GatewayAdmin
from trainer.rollout.subproc import SubprocAgentPool, SubprocPicklingError

REPO = Path(__file__).resolve().parents[1]
AGENTS = f"{REPO / 'tests' / 'subproc_agents.py'}"
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def pool() -> Iterator[SubprocAgentPool]:
    """One pool for the module: spawning a worker costs a second or two."""
    with SubprocAgentPool(2) as p:
        yield p


SUBPROC = AgentConfig(mode="subproc", subproc_max_workers=2, max_retries=0)


def _gateway(gw: Any, http: httpx.AsyncClient) -> list[GatewayAdmin]:
    return [GatewayAdmin(gw.url, ADMIN_KEY, http)]


def _runner(gw: Any, agent: Any, http: httpx.AsyncClient, pool: SubprocAgentPool) -> AgentRunner:
    runner = AgentRunner(_gateway(gw, http), agent, placement=SUBPROC)
    runner._pool.close()  # never started: swap in the shared one
    runner._pool = pool
    return runner


def _reporting_agent(tmp_path: Path) -> Any:
    return make_workflow(f"{AGENTS}:ReportingSyncAgent", {"report_dir": str(tmp_path)})


async def test_sync_openai_agent_runs_in_a_worker_with_the_session_env(
    gateway_factory, pool, tmp_path
) -> None:
    gw = gateway_factory()
    agent = _reporting_agent(tmp_path)
    # Loaded by path: a generated module name that only the shipped file path resolves.
    assert type(agent).__module__.startswith("turnstile_workflow_subproc_agents_")
    data = {"messages": QUESTION, "answer": "4", "reward": 0.5, "tag": "ok"}
    async with httpx.AsyncClient(timeout=60) as http:
        runner = _runner(gw, agent, http, pool)
        episodes = await runner.run_group(data, group=3, group_size=3)
        admin = GatewayAdmin(gw.url, ADMIN_KEY, http)
        views = {ep.session_id: await admin.session(ep.session_id) for ep in episodes}

    reports = read_reports(tmp_path)
    assert len(reports) == 3
    by_completion = {r["completion_id"]: r for r in reports}
    for ep in episodes:
        assert ep.error is None and not ep.no_reward, ep
        assert ep.reward == 0.5 and ep.num_completions == 1
        assert [s["reward"] for s in ep.samples] == [0.5]
        (completion,) = views[ep.session_id]["completions"]
        assert completion["reward"] == 0.5
        # The completion the agent made is recorded in this episode's session.
        report = by_completion[completion["id"]]
        assert report["base_url"] == gw.url
        assert report["extra_kwargs"] == []  # no http_client, no base_url kwargs
        assert report["pid"] != os.getpid()
    # Each run saw its own session's key in OPENAI_API_KEY.
    assert len({r["api_key"] for r in reports}) == 3
    pids = {r["pid"] for r in reports}
    assert len(pids) <= 2 and pids <= set(pool.worker_pids())
    assert os.environ.get("OPENAI_API_KEY") not in {r["api_key"] for r in reports}


async def test_the_example_sync_math_agent(gateway_factory, pool) -> None:
    gw = gateway_factory()
    agent = make_workflow(f"{REPO / 'agents' / 'math_sync_openai.py'}:MathSyncOpenAIAgent")
    async with httpx.AsyncClient(timeout=60) as http:
        runner = _runner(gw, agent, http, pool)
        right, wrong = await asyncio.gather(
            runner.run_episode({"messages": QUESTION, "answer": "4"}, group=0),
            runner.run_episode({"messages": QUESTION, "answer": "5"}, group=1),
        )
    assert right.error is None and right.reward == 1.0 and right.num_completions == 1
    assert wrong.error is None and wrong.reward == 0.0 and wrong.num_completions == 1
    assert right.samples[0]["reward"] == 1.0


@pytest.mark.parametrize(
    ("cls", "culprit"),
    [("LockedAgent", "agent.lock (_thread.lock)"), ("LambdaAgent", "agent.score (function)")],
)
async def test_unpicklable_agent_fails_before_any_session(gateway_factory, cls, culprit) -> None:
    gw = gateway_factory()
    agent = make_workflow(f"{AGENTS}:{cls}")
    async with httpx.AsyncClient(timeout=60) as http:
        with pytest.raises(SubprocPicklingError) as info:
            AgentRunner(_gateway(gw, http), agent, placement=SUBPROC)
        assert await list_sessions(gw, http) == []
    message = str(info.value)
    assert isinstance(info.value, WorkflowError)
    assert "agent must be picklable" in message and "subproc" in message
    assert cls in message and culprit in message
    assert "mode: inline" in message


async def test_unpicklable_data_fails_before_its_session(gateway_factory, tmp_path) -> None:
    gw = gateway_factory()
    async with httpx.AsyncClient(timeout=60) as http:
        runner = AgentRunner(_gateway(gw, http), _reporting_agent(tmp_path), placement=SUBPROC)
        with pytest.raises(SubprocPicklingError, match="data must be picklable.*mode: inline"):
            await runner.run_episode({"messages": QUESTION, "check": lambda x: x}, group=0)
        assert await list_sessions(gw, http) == []
        await runner.close()  # no worker was ever started


async def test_agent_errors_become_episode_errors(gateway_factory, pool, tmp_path) -> None:
    gw = gateway_factory()
    async with httpx.AsyncClient(timeout=60) as http:
        runner = _runner(gw, _reporting_agent(tmp_path), http, pool)
        raised, odd, bad_return = await asyncio.gather(
            runner.run_episode({"behave": "raise", "tag": "t1"}, group=0),
            runner.run_episode({"behave": "raise_unpicklable"}, group=1),
            runner.run_episode({"behave": "unpicklable_return"}, group=2),
        )
        # The agent's own exception type, as itself when it survives pickling...
        with pytest.raises(ValueError, match="on purpose"):
            await pool.run(
                runner.agent, {"behave": "raise", "tag": "t2"}, base_url=gw.url, api_key="k"
            )
        sessions = await list_sessions(gw, http)
    assert raised.error == "ValueError: agent failed on purpose (t1)"
    # ... and by name and message when it does not.
    assert odd.error == "NeedsArgsError: weird (code 7)"
    assert bad_return.error is not None
    assert "return value" in bad_return.error and "could not be pickled back" in bad_return.error
    assert len(sessions) == 3 and all(s["ended_at"] is not None for s in sessions), sessions


async def test_a_dying_worker_fails_only_its_episode(gateway_factory, pool, tmp_path) -> None:
    gw = gateway_factory()
    ok = {"messages": QUESTION, "answer": "4", "tag": "ok"}
    async with httpx.AsyncClient(timeout=60) as http:
        runner = _runner(gw, _reporting_agent(tmp_path), http, pool)
        died, alongside = await asyncio.gather(
            runner.run_episode({"behave": "exit"}, group=0),
            runner.run_episode(ok, group=1),
        )
        after: list[Episode] = await runner.run_group(ok, group=2, group_size=2)
    assert died.error is not None
    assert "SubprocWorkerDied" in died.error and "exit code 1" in died.error
    for ep in [alongside, *after]:
        assert ep.error is None and ep.reward == 1.0 and ep.num_completions == 1
    assert len(pool.worker_pids()) <= 2


async def test_a_dead_worker_runs_the_episode_again_in_a_new_session(
    gateway_factory, pool, tmp_path
) -> None:
    gw = gateway_factory()
    data = {"messages": QUESTION, "tag": "once", "behave": "exit_once"}
    async with httpx.AsyncClient(timeout=60) as http:
        runner = AgentRunner(
            _gateway(gw, http),
            _reporting_agent(tmp_path),
            placement=AgentConfig(mode="subproc", subproc_max_workers=2, max_retries=1),
        )
        runner._pool.close()  # never started: swap in the shared one
        runner._pool = pool
        ep = await runner.run_episode(data, group=0)
        sessions = await list_sessions(gw, http)
    assert ep.error is None and ep.reward == 1.0 and ep.retries == 1 and not ep.worker_died
    assert len(sessions) == 2 and all(s["ended_at"] is not None for s in sessions)
    assert [r["tag"] for r in read_reports(tmp_path)] == ["once"]


async def test_a_worker_killed_between_runs_fails_no_later_run(
    gateway_factory, pool, tmp_path
) -> None:
    """An idle worker that dies (the OOM killer, a `kill`) is replaced: the next run works."""
    gw = gateway_factory()
    ok = {"messages": QUESTION, "answer": "4", "tag": "ok"}
    async with httpx.AsyncClient(timeout=60) as http:
        runner = _runner(gw, _reporting_agent(tmp_path), http, pool)
        before = await runner.run_episode(ok, group=0)
        pids = pool.worker_pids()
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        after = await runner.run_episode(ok, group=1)
    for ep in (before, after):
        assert ep.error is None and ep.reward == 1.0 and ep.num_completions == 1


async def test_close_stops_the_workers(gateway_factory, tmp_path) -> None:
    gw = gateway_factory()
    async with httpx.AsyncClient(timeout=60) as http:
        runner = AgentRunner(
            _gateway(gw, http),
            _reporting_agent(tmp_path),
            placement=AgentConfig(mode="subproc", subproc_max_workers=1, max_retries=0),
        )
        ep = await runner.run_episode({"messages": QUESTION, "tag": "ok"}, group=0)
        assert ep.error is None and ep.reward == 1.0
        (pid,) = runner._pool.worker_pids()
        await runner.close()
        await runner.close()  # idempotent
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        after = await runner.run_episode({"messages": QUESTION}, group=1)
    assert after.error is not None and "closed" in after.error


async def test_mode_and_pool_size_are_checked() -> None:
    async with httpx.AsyncClient() as http:
        unused = [GatewayAdmin("http://unused/v1", None, http)]
        with pytest.raises(WorkflowError, match="'inline', 'subproc' or 'ray', got 'thread'"):
            AgentRunner(unused, object(), placement=AgentConfig(mode="thread"))
        with pytest.raises(WorkflowError, match="subproc runs `async def run.*object has none"):
            AgentRunner(unused, object(), placement=SUBPROC)
        agent = make_workflow(f"{AGENTS}:LockedAgent")
        agent.lock = None
        with pytest.raises(WorkflowError, match="subproc_max_workers must be an integer >= 1"):
            AgentRunner(unused, agent, placement=AgentConfig(mode="subproc", subproc_max_workers=0))
        inline = AgentRunner(unused, object())
        assert inline.mode == "inline" and inline._pool is None
        await inline.close()
