"""Two nodes, for real, on one machine: network namespaces A and B joined by a veth
pair (tests/netns_cluster.py), each started with the deploy/ray/ scripts as a user
would start two machines:

- a Ray node in each (deploy/ray/node.sh: head on A, worker on B with the resource
  `node_b` the agents ask for), token auth on, no dashboard, usage stats off;
- a gateway replica in each (deploy/ray/gateway.sh, embedded engine), both on one
  PostgreSQL (reached through its Unix socket: the filesystem is shared);
- a two-rank DeepSpeed trainer, a rank on each node (deploy/ray/trainer.sh: torchrun,
  gloo over the veth pair), with `gateway.urls` naming both replicas and
  `rollout.agent.mode: ray`: every agent runs on node B, and each step's weights go
  from rank 0 to both gateways' engines without disk.

Steps 1-2 train normally. Step 3's agents hold after their turn; the test then kills
node B's raylet. The step still finishes: those episodes are counted as failed (their
worker died, `max_retries: 0`), their sessions are not trained on, and nothing is
recorded twice.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml
from gateway_helpers import recorded
from netns_cluster import TwoNodes, child_named, wait_for
from trainer_helpers import make_tiny_model

pytest.importorskip("ray", reason="Ray is the optional extra turnstile-rl[ray]")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "ray"
VENV_BIN = Path(sys.executable).parent
STEPS = 3
EPISODES_PER_STEP = 4  # batch_size 2 x group_size 2


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _socket_url(tcp_url: str, socket_dir: Path) -> str:
    """The same database through PostgreSQL's Unix socket, which every namespace sees."""
    url = urllib.parse.urlsplit(tcp_url)
    return (
        f"postgresql+psycopg://turnstile@/{url.path.lstrip('/')}?host={socket_dir}&port={url.port}"
    )


def test_agents_gateways_and_trainer_ranks_across_two_nodes(postgres, tmp_path, tokenizer) -> None:
    model = make_tiny_model(tmp_path / "tiny", tokenizer)
    database = postgres.create_database()
    reports = tmp_path / "reports"
    reports.mkdir()
    run_dir = tmp_path / "run"
    admin_key = secrets.token_hex(16)
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        # the head notices a dead node within seconds, not its default half minute
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
        "TURNSTILE_ADMIN_KEY": admin_key,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        # DeepSpeed's CPU ops, built once (as `make test` sets it), not once per rank
        "TORCH_EXTENSIONS_DIR": os.environ.get(
            "TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions")
        ),
    }
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(var, None)

    with TwoNodes(tmp_path / "nodes") as nodes:
        a, b = nodes.a, nodes.b

        def check_alive(*names_procs) -> None:  # type: ignore[no-untyped-def]
            for name, proc in names_procs:
                # a dead rank's torchrun waits minutes for the other node: fail now
                log = nodes.log(name)
                if not proc.alive() or ("[rank" in log and "Traceback" in log):
                    pytest.fail(f"{name} failed ({proc.popen.poll()}):\n{nodes.logs()}")

        # ---- a Ray node on each ----------------------------------------------------------
        ray_node = {"NUM_CPUS": "1", "OBJECT_STORE_BYTES": str(80 * 2**20)}
        head = nodes.start(a, "ray-a", [str(DEPLOY / "node.sh"), "head", "--block"], {
            **env, **ray_node, "NODE_IP": a.ip, "RESOURCES": '{"node_a": 1}',
            "TEMP_DIR": str(nodes.short / "a"),
        })  # fmt: skip
        wait_for(lambda: check_alive(("ray-a", head)) or child_named(head.pid, "raylet"),
                 120, "node A's raylet")  # fmt: skip
        worker = nodes.start(b, "ray-b", [str(DEPLOY / "node.sh"), "worker", "--block"], {
            **env, **ray_node, "NUM_CPUS": "2", "NODE_IP": b.ip, "HEAD_IP": a.ip,
            "RESOURCES": '{"node_b": 4}', "TEMP_DIR": str(nodes.short / "b"),
        })  # fmt: skip
        raylet_b = wait_for(
            lambda: check_alive(("ray-b", worker)) or child_named(worker.pid, "raylet"),
            120, "node B's raylet",
        )  # fmt: skip

        # ---- a gateway on each, one PostgreSQL -------------------------------------------
        gw_env = {**env, "DATABASE": _socket_url(database, postgres.root)}
        gateways = {}
        for node in (a, b):
            argv = [str(DEPLOY / "gateway.sh"), "--engine", "embedded", "--model", str(model),
                    "--default-max-tokens", "6"]  # fmt: skip
            node_env = {**gw_env, "NODE_IP": node.ip, "GLOO_SOCKET_IFNAME": node.ifname}
            proc = nodes.start(node, f"gateway-{node.ip}", argv, node_env)
            gateways[f"http://{node.ip}:8000/v1"] = (node, proc)
        for url, (node, proc) in gateways.items():
            probe = (
                f"import urllib.request; urllib.request.urlopen('{url[:-3]}/healthz', timeout=2)"
            )

            def healthy(node=node, proc=proc, probe=probe) -> bool:  # type: ignore[no-untyped-def]
                check_alive((f"gateway-{node.ip}", proc))
                try:
                    nodes.run(node, [sys.executable, "-c", probe])
                except Exception:
                    return False
                return True

            wait_for(healthy, 180, f"gateway {url}", every_s=1.0)

        # ---- the trainer: a rank on each node --------------------------------------------
        config = {
            "run_dir": str(run_dir),
            "model": str(model),
            "total_steps": STEPS,
            "workflow": str(REPO / "tests" / "two_node_agents.py") + ":NodeReportingAgent",
            "workflow_kwargs": {
                "report_dir": str(reports),
                "hold_after": EPISODES_PER_STEP * (STEPS - 1),
            },
            "dataset": {
                "type": "python",
                "function": "agents/math_task.py:arithmetic_word_problems",
                "size": 16,
                "seed": 0,
            },  # fmt: skip
            "rollout": {
                "batch_size": 2,
                "group_size": 2,
                "max_staleness": 0,
                "agent": {
                    "mode": "ray",
                    "num_cpus": 0.5,
                    "resources": {"node_b": 1},
                    "max_retries": 0,
                },
            },  # fmt: skip
            "ray": {"address": f"{a.ip}:6379"},
            "gateway": {"urls": list(gateways), "admin_key": admin_key},
            "train": {
                "lr": 1e-3,
                "zero_stage": 2,
                "micro_batch_tokens": 96,
                "engine_class": str(REPO / "tests" / "fingerprint_engine.py")
                + ":FingerprintEngine",
            },  # fmt: skip
            "tensorboard": False,
        }
        cfg_path = tmp_path / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        ranks = []
        for rank, node in enumerate((a, b)):
            rank_env = {**env, "HEAD_IP": a.ip, "NNODES": "2", "NODE_RANK": str(rank),
                        "MASTER_PORT": "29500", "GLOO_SOCKET_IFNAME": node.ifname,
                        "PYTHON": sys.executable}  # fmt: skip
            argv = [str(DEPLOY / "trainer.sh"), str(cfg_path)]
            ranks.append((f"rank{rank}", nodes.start(node, f"rank{rank}", argv, rank_env)))

        # ---- steps 1-2, then node B dies during step 3 -----------------------------------
        def held() -> int:
            check_alive(*ranks)
            return len(list(reports.glob("held-*"))) >= EPISODES_PER_STEP

        began = time.monotonic()
        try:
            wait_for(held, 480, "step 3's agents to start on node B")
        except TimeoutError as exc:
            pytest.fail(f"{exc}\n{nodes.logs()}")
        trained_s = time.monotonic() - began
        held_pids = [json.loads(p.read_text())["pid"] for p in reports.glob("held-*")]
        os.kill(raylet_b, signal.SIGKILL)
        # its workers go with it (they lose their raylet); none may finish its episode
        wait_for(lambda: not any(psutil.pid_exists(p) for p in held_pids), 120,
                 "node B's agent workers to die with their raylet")  # fmt: skip
        (reports / "release").touch()  # for nothing: no episode is run again
        for name, proc in ranks:
            try:
                proc.popen.wait(timeout=240)
            except Exception:
                pytest.fail(f"{name} did not finish after node B died:\n{nodes.log(name)}")
            assert proc.popen.returncode == 0, f"{name} failed:\n{nodes.log(name)}"
        committed = {}
        for url, (node, _) in gateways.items():
            page = nodes.run(node, [sys.executable, "-c",
                f"import urllib.request; print(urllib.request.urlopen('{url[:-3]}/metrics').read().decode())"])  # fmt: skip
            line = next(
                x for x in page.splitlines() if x.startswith("turnstile_records_committed ")
            )
            committed[url] = float(line.split()[1])

    print(f"two nodes: steps 1-2 and step 3's start took {trained_s:.0f} s")
    metrics = _metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["world_size"] == 2 for m in metrics)
    # both ranks hold the same weights at the end
    digests = {p.name: p.read_text() for p in (run_dir).glob("weights-rank*.sha256")}
    assert sorted(digests) == ["weights-rank0.sha256", "weights-rank1.sha256"]
    assert len(set(digests.values())) == 1

    by_completion = {}
    for path in reports.glob("report-*.json"):
        report = json.loads(path.read_text())
        assert report["completion_id"] not in by_completion  # one report per completion
        by_completion[report["completion_id"]] = report
    # every agent ran on node B
    assert {r["node_ip"] for r in by_completion.values()} == {b.ip}

    sessions, completions = recorded(database)
    per_session = Counter(sid for _, sid, _ in completions)
    for step in metrics[:2]:
        assert step["episodes"] == EPISODES_PER_STEP and step["episode_errors"] == 0
        assert step["num_samples"] > 0
    # every episode recorded once, on the gateway its session was opened on
    for cid, sid, _ in completions:
        assert per_session[sid] == 1
        assert by_completion[cid]["base_url"] == sessions[sid]["gateway"]
    for url in gateways:
        assert committed[url] == sum(1 for _, sid, _ in completions
                                     if sessions[sid]["gateway"] == url)  # fmt: skip
    # both gateways served each step; step 2's tokens carry version 1, on both
    versions = {sid: got for _, sid, got in completions}
    for step, version in ((0, 0), (1, 1)):
        used = {sessions[sid]["gateway"] for sid in metrics[step]["sessions"]}
        assert used == set(gateways)
        assert all(versions[sid] == {version} for sid in metrics[step]["sessions"])
    # step 3: node B died under its agents; counted as failed, not trained on, not retried
    last = metrics[2]
    assert last["episodes"] == EPISODES_PER_STEP
    assert last["episode_errors"] == EPISODES_PER_STEP and last["episode_retries"] == 0
    assert last["num_samples"] == 0
    assert all(versions[sid] == {2} for sid in last["sessions"] if sid in versions)
    assert len(completions) == len(by_completion) == EPISODES_PER_STEP * STEPS
