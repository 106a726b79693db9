"""The embedded engine on the demo's first-turn batch: shared-prefix prefill on and off.

The demo's requests share a system prompt, which a batch used to prefill once per row.
Both engines run in one process, on real SmolLM2 chat-template renders, with the demo's
sampling (temperature 0.7, 48 new tokens).

    .venv/bin/python -m bench.engine_batch [--rounds 3] [--rows 32] [--no-docs]
"""

from __future__ import annotations

import asyncio
import json

import torch

from bench.report import ROOT, alternate, arguments, measured_on, medians, publish, section, table
from gateway.inference.base import SamplingParams
from gateway.inference.embedded import EmbeddedEngine
from gateway.inference.model_source import resolve_model_dir
from trainer.api import import_file


def demo_prompts(rows: int) -> list[list[int]]:
    """The demo's first-turn prompts, as the gateway renders them."""
    from transformers import AutoTokenizer

    task = import_file(ROOT / "agents" / "math_task.py")
    data = task.arithmetic_word_problems(size=rows, seed=0)
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(None))
    prompts = []
    for row in data:
        text = tok.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
        prompts.append(tok.encode(text, add_special_tokens=False))
    return prompts


async def one_batch(engine: EmbeddedEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0.7, max_new_tokens=48, seed=0, stop_token_ids=[2])
    await asyncio.gather(*(engine.generate(p, params) for p in prompts))


def run(rounds: int, rows: int) -> dict:
    prompts = demo_prompts(rows)
    engines = {
        "shared prefix": EmbeddedEngine(None, max_batch_size=64, share_prefix=True),
        "per-row prefill": EmbeddedEngine(None, max_batch_size=64, share_prefix=False),
    }
    loop = asyncio.new_event_loop()  # the engines' loop, entered once per batch
    for engine in engines.values():
        loop.run_until_complete(engine.start())
        loop.run_until_complete(one_batch(engine, prompts[:2]))  # warm up
    steps = {
        name: lambda engine=engine: loop.run_until_complete(one_batch(engine, prompts))
        for name, engine in engines.items()
    }
    times = alternate(steps, rounds, warm_up=False)
    shared = engines["shared prefix"].prefix_tokens_shared
    for engine in engines.values():
        loop.run_until_complete(engine.close())
    loop.close()
    med = medians(times)
    return {
        "rows": rows,
        "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1),
        "median_s": {k: round(v, 2) for k, v in med.items()},
        "rounds_s": {k: [round(t, 2) for t in ts] for k, ts in times.items()},
        "speedup": round(med["per-row prefill"] / med["shared prefix"], 2),
        "prefix_tokens_shared": shared,
    }


def main() -> None:
    parser = arguments(__doc__, rounds=3)
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args()
    result = run(args.rounds, args.rows)
    print(json.dumps(result))
    rows = [
        {"engine": k, "median s per batch": v, "each round s": result["rounds_s"][k]}
        for k, v in result["median_s"].items()
    ]
    intro = (
        f"{measured_on()}, torch {torch.__version__}, {torch.get_num_threads()} threads: "
        f"`python -m bench.engine_batch --rounds {args.rounds} --rows {args.rows}`: "
        f"{args.rows} demo prompts (mean {result['prompt_tokens_mean']} tokens) at once, "
        "temperature 0.7, up to 48 new tokens; median of alternating rounds."
    )
    verdict = f"Shared-prefix prefill is **{result['speedup']:.2f}x** faster on this batch."
    publish(
        args, section("engine-batch", "bench/engine_batch.py", intro, table(rows, "lrl"), verdict)
    )


if __name__ == "__main__":
    main()
