"""A weight push of SmolLM2 against the disk path, into a gateway in its own process.

Push: trainer rank 0 broadcasts over gloo (trainer/backend/weight_push.py). Disk: the
trainer writes a Hugging Face folder, then `POST /admin/weights` {version, path}. Both
end when the engine serves the new version. `--vllm-url` also pushes into a running vLLM
server (started with deploy/vllm/'s worker extension) behind an in-process gateway.

    .venv/bin/python -m bench.weight_push [--rounds 5] [--vllm-url URL] [--no-docs]
"""

from __future__ import annotations

import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import torch

from bench.report import alternate, arguments, measured_on, medians, publish, section, table
from gateway.inference.model_source import load_causal_lm, resolve_model_dir
from trainer.backend.weight_push import WeightPush, gateway_root


@contextmanager
def embedded_gateway(work: Path) -> Iterator[tuple[str, str]]:
    """`turnstile serve --engine embedded` in its own process: (url, admin key)."""
    from bench.replicas import Replicas

    with Replicas(1, str(work / "g.db"), work, ["--engine", "embedded"]) as gw:
        yield gw.urls[0], gw.admin_key


@contextmanager
def vllm_gateway(work: Path, vllm_url: str) -> Iterator[tuple[str, str]]:
    """A gateway in this process in front of a running vLLM server."""
    from gateway.config import GatewayConfig
    from gateway.server import BackgroundGateway

    config = GatewayConfig(
        port=0,
        database=str(work / "g.db"),
        admin_key="bench-admin",
        model=str(resolve_model_dir(None)),
        engine="vllm",
        engine_urls=[vllm_url],
        request_timeout_s=600,
    )
    with BackgroundGateway(config) as gw:
        yield gw.url, "bench-admin"


def run(rounds: int, vllm_url: str | None) -> dict[str, float]:
    model = load_causal_lm(resolve_model_dir(None)).eval()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    nbytes = sum(t.numel() * t.element_size() for k, t in state.items() if k != "lm_head.weight")
    writes: list[float] = []
    with tempfile.TemporaryDirectory(prefix="weight-push-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        gateway = vllm_gateway(work, vllm_url) if vllm_url else embedded_gateway(work)
        with (
            gateway as (url, admin_key),
            httpx.Client(timeout=900, headers={"Authorization": f"Bearer {admin_key}"}) as http,
        ):
            weights = f"{gateway_root(url)}/admin/weights"
            versions = itertools.count(int(http.get(weights).json()["policy_version"]) + 1)
            with WeightPush([url], admin_key) as pusher:
                first = pusher.push(next(versions), state)

                def disk() -> None:
                    version = next(versions)
                    folder = work / f"v{version}"
                    t0 = time.perf_counter()
                    model.save_pretrained(folder, state_dict=state)
                    writes.append(time.perf_counter() - t0)
                    http.post(
                        weights, json={"version": version, "path": str(folder)}
                    ).raise_for_status()
                    shutil.rmtree(folder, ignore_errors=True)

                steps = {"push": lambda: pusher.push(next(versions), state), "disk": disk}
                med = medians(alternate(steps, rounds, warm_up=False))
    return {
        "mib": nbytes / 2**20,
        "first_push_s": first.seconds,
        "join_s": first.join_s,
        "push_s": med["push"],
        "disk_s": med["disk"],
        "disk_write_s": statistics.median(writes),
    }


def doc_section(results: dict[str, dict[str, float]], rounds: int) -> str:
    rows = [
        {
            "engine": name,
            "push": f"{r['push_s']:.2f} s",
            "disk (of which writing)": f"{r['disk_s']:.2f} s ({r['disk_write_s']:.2f} s)",
            "disk / push": f"{r['disk_s'] / r['push_s']:.1f}x",
            "first push (forming the group)": f"{r['first_push_s']:.2f} s ({r['join_s']:.2f} s)",
        }
        for name, r in results.items()
    ]
    mib = next(iter(results.values()))["mib"]
    intro = (
        f"{measured_on()}, busy with other runs; median of {rounds} rounds each, alternating "
        "(`python -m bench.weight_push --vllm-url URL`, vLLM started as deploy/vllm/ starts "
        f"it). SmolLM2-135M in fp32, {mib:.0f} MiB sent once (the tied `lm_head.weight` is "
        "the embedding)."
    )
    return section("weight-push", "bench/weight_push.py", intro, table(rows, "lllll"))


def main() -> None:
    ap = arguments(__doc__, rounds=5)
    ap.add_argument("--vllm-url", help="also push into this running vLLM server")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {"embedded, gateway in its own process": run(args.rounds, None)}
    if args.vllm_url:
        results["vLLM CPU"] = run(args.rounds, args.vllm_url)
    print(results)
    publish(args, doc_section(results, args.rounds))


if __name__ == "__main__":
    main()
