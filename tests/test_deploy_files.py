"""What deploy/ claims about itself holds: the Ray recipe is a cluster config Ray
accepts that starts its nodes with the scripts tests/test_two_nodes.py runs, and every
file no test runs says so in its header."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
NOT_RUN = ["slurm/train_multinode.sbatch", "k8s/turnstile.yaml", "compose.yaml"]


def test_the_ray_cluster_recipe_is_valid_and_starts_nodes_as_the_two_node_test_does() -> None:
    pytest.importorskip("ray", reason="Ray is the optional extra turnstile-rl[ray]")
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((DEPLOY / "ray" / "cluster.yaml").read_text())
    validate_config(prepare_config(config))
    (head,) = config["head_start_ray_commands"]
    (worker,) = config["worker_start_ray_commands"]
    assert "deploy/ray/node.sh head" in head and "node_a" in head
    assert "deploy/ray/node.sh worker" in worker and "node_b" in worker
    test = (DEPLOY.parent / "tests" / "test_two_nodes.py").read_text()
    for script in ("node.sh", "gateway.sh", "trainer.sh"):
        assert f'DEPLOY / "{script}"' in test  # the test runs each script itself


@pytest.mark.parametrize("script", sorted(p.name for p in (DEPLOY / "ray").glob("*.sh")))
def test_the_ray_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(DEPLOY / "ray" / script)], check=True)


@pytest.mark.parametrize("name", NOT_RUN)
def test_files_no_test_runs_say_so_in_their_header(name: str) -> None:
    head = "\n".join((DEPLOY / name).read_text().splitlines()[:4])
    assert "NOT RUN" in head
