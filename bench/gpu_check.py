"""Ready for a GPU: a weight push between two processes, and one DeepSpeed step in bf16.

Run by bench/gpu_check.sh (at most 8 minutes on one H100), on a Qwen3-0.6B-shaped model
initialised from its config (no weights fetched):
1. the push from a trainer process into an engine process, until the engine holds the
   weights. Two processes on one GPU share it through CUDA IPC (NCCL refuses two ranks
   on one device; vLLM's `ipc` backend does the same); the group trainer/backend/
   weight_push.py forms (gloo on CPU, NCCL across GPUs) is timed with its own choice for
   ranks sharing a GPU, and NCCL between them is tried last;
2. DeepSpeed in bf16 (ZeRO 1, fp32 master weights) against a bare PyTorch step (bf16
   autocast, AdamW) on the real Qwen3 tokenizer's ids (tests/fetch_tokenizers.py).

`--dry-run`: CPU, gloo, fp32 and a tiny model of the same family, so a machine without
a GPU (and tests/test_gpu_check.py) runs every line of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from bench.report import ROOT, alternate, medians
from gateway.inference.weight_broadcast import (
    GroupSpec,
    Manifest,
    backend_for,
    device_id,
    group_backend,
    host_store,
    open_group,
    receive,
    send,
)

# Qwen3-0.6B's config.json (its shape only: the weights are random)
QWEN3_0_6B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
}
# the dry run's: the same family and vocabulary, a few layers of width 64
TINY = {
    **QWEN3_0_6B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def build_model(shape: dict[str, Any], dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**shape)
    config.use_cache = False
    return Qwen3ForCausalLM(config).to(device=device, dtype=dtype)


def token_batch(seqs: int, tokens: int) -> list[list[int]]:
    """`seqs` sequences of `tokens` ids: this repository's docs through the real tokenizer."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "tests"))
    from fetch_tokenizers import family_dir

    folder = family_dir("qwen3")
    if not (folder / "tokenizer.json").is_file():
        raise SystemExit(f"no Qwen3 tokenizer at {folder}: run tests/fetch_tokenizers.py")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    ids = tokenizer(text)["input_ids"]
    while len(ids) < seqs * tokens:
        ids = ids + ids
    return [ids[i * tokens : (i + 1) * tokens] for i in range(seqs)]


# ---- 1. the weight push ------------------------------------------------------------------
def checksum(params: dict[str, torch.Tensor]) -> float:
    return float(sum(p.detach().double().sum() for p in params.values()))


def _engine_process(
    transport: str, shape: dict[str, Any], dtype: torch.dtype, device: str, inbox: Any, outbox: Any
) -> None:
    """The receiving side: its own model; takes each push and answers a checksum."""
    params = dict(build_model(shape, dtype, device).named_parameters())
    outbox.put("ready")
    try:
        while (msg := inbox.get()) is not None:
            group = None
            if transport == "ipc":  # CUDA tensors, mapped from the trainer's memory by IPC
                tensors = msg.items()
            else:
                spec, manifest, rank = msg
                group = open_group(GroupSpec.from_json(spec), rank, device)
                tensors = receive(group, Manifest.from_json(manifest), device)
            with torch.no_grad():
                for name, t in tensors:
                    if name in params:
                        params[name].copy_(t)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if group is not None:
                group.shutdown()
            del msg, tensors  # an IPC mapping is released with its last reference
            outbox.put(checksum(params))
    except Exception as exc:  # the trainer side reports it, instead of waiting it out
        outbox.put(f"engine failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def weight_push(
    shape: dict[str, Any],
    dtype: torch.dtype,
    device: str,
    rounds: int,
    transport: str | None = None,
    wait_s: float = 600,
) -> dict:
    """Median push time over `rounds`; `transport` forces one (the NCCL attempt)."""
    # both processes on one GPU share it through CUDA IPC; on CPU, the group's backend
    transport = transport or ("ipc" if device.startswith("cuda") else backend_for(device))
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    engine = ctx.Process(
        target=_engine_process, args=(transport, shape, dtype, device, inbox, outbox)
    )
    engine.start()
    try:
        model = build_model(shape, dtype, device)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)  # the trainer's weights differ from the engine's start
        named = dict(model.named_parameters())
        expected = checksum(named)
        manifest, tensors = Manifest.of(named)
        assert outbox.get(timeout=wait_s) == "ready"
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            if transport == "ipc":
                inbox.put({k: v.detach() for k, v in named.items()})
            else:
                spec = GroupSpec("127.0.0.1", 0, 2, transport, f"r{len(times)}", wait_s)
                store = host_store(spec)
                spec = GroupSpec("127.0.0.1", store.port, 2, transport, spec.group_id, wait_s)
                inbox.put((spec.to_json(), manifest.to_json(), 1))
                group = open_group(spec, 0, device, store)
                send(group, tensors)
                group.shutdown()
            got = outbox.get(timeout=wait_s)
            times.append(time.perf_counter() - t0)
            if isinstance(got, str):
                raise RuntimeError(got)
            if abs(got - expected) > 1e-3 * max(1.0, abs(expected)):
                raise SystemExit(f"the engine holds other weights: {got} != {expected}")
        inbox.put(None)
        engine.join(60)
    finally:
        if engine.is_alive():
            engine.kill()
    return {
        "transport": transport,
        "mib": manifest.nbytes / 2**20,
        "push_s": statistics.median(times),
        "first_push_s": times[0],
    }


# ---- 2. the training step ------------------------------------------------------------------
def _loss(model: Any, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, position_ids=pos).logits[0, :-1].float()
    return torch.nn.functional.cross_entropy(logits, ids[0, 1:])


def training_step(
    shape: dict[str, Any], bf16: bool, device: str, batch: list[list[int]], rounds: int
) -> dict:
    import deepspeed

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29563")
    deepspeed.init_distributed(dist_backend=backend_for(device), verbose=False)
    ids = torch.tensor([[t for s in batch for t in s]], device=device)
    pos = torch.tensor([[p for s in batch for p in range(len(s))]], device=device)
    lr = 1e-5

    ds_model = build_model(shape, torch.float32, device)
    ds_opt = torch.optim.AdamW(ds_model.parameters(), lr=lr)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=ds_model, optimizer=ds_opt, config=config)

    bare = build_model(shape, torch.float32, device)
    bare_opt = torch.optim.AdamW(bare.parameters(), lr=lr)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and device != "cpu")

    sync = torch.cuda.synchronize if device != "cpu" else lambda: None

    def ds_step() -> None:
        loss = _loss(engine, ids, pos)
        engine.backward(loss)
        engine.step()
        sync()  # timed to the end of its GPU work

    def bare_step() -> None:
        with autocast:
            loss = _loss(bare, ids, pos)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(bare.parameters(), 1.0)
        bare_opt.step()
        bare_opt.zero_grad(set_to_none=True)
        sync()

    times = alternate({"deepspeed": ds_step, "bare": bare_step}, rounds)
    tokens = ids.numel()
    med = medians(times)
    return {
        "tokens": tokens,
        "deepspeed_tokens_per_s": tokens / med["deepspeed"],
        "bare_tokens_per_s": tokens / med["bare"],
        "ratio": med["deepspeed"] / med["bare"],
        "deepspeed_step_s": med["deepspeed"],
        "bare_step_s": med["bare"],
        "params": sum(p.numel() for p in bare.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, fp32, a tiny model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args()
    if args.dry_run:  # sequences x tokens in the training step's batch: 2 x 64, or 8 x 1024
        device, shape, dtype, bf16, size = "cpu", TINY, torch.float32, False, (2, 64)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no GPU here: run with --dry-run")
        device, shape, dtype, bf16, size = "cuda:0", QWEN3_0_6B, torch.bfloat16, True, (8, 1024)
    card = torch.cuda.get_device_name(0) if device != "cpu" else "CPU (dry run)"
    print(f"device: {card}; model: {shape['num_hidden_layers']} layers x {shape['hidden_size']}")
    batch = token_batch(*size)
    push = weight_push(shape, dtype, device, args.rounds)
    print(
        f"weight push ({push['transport']}, two processes): {push['mib']:.0f} MiB in "
        f"{push['push_s']:.3f} s (first {push['first_push_s']:.3f} s)",
        flush=True,
    )
    if device != "cpu":  # what trainer/backend/weight_push.py picks for ranks sharing a GPU
        ours = group_backend([device_id(device)] * 2)
        staged = weight_push(shape, dtype, device, args.rounds, ours)
        push["ours_same_gpu"] = staged
        print(
            f"weight push (our group's choice for one GPU: {ours}): {staged['push_s']:.3f} s "
            f"(first {staged['first_push_s']:.3f} s)",
            flush=True,
        )
    step = training_step(shape, bf16, device, batch, args.rounds)
    print(
        f"training step ({step['params'] / 1e6:.0f}M params, {step['tokens']} tokens, "
        f"{'bf16' if bf16 else 'fp32'}): DeepSpeed {step['deepspeed_tokens_per_s']:.0f} tokens/s, "
        f"bare PyTorch {step['bare_tokens_per_s']:.0f} tokens/s, "
        f"ratio {step['ratio']:.2f}x (DeepSpeed time / bare time)"
    )
    figures = {"device": card, "push": push, "step": step}
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    # last: if NCCL hangs rather than refuses, its watchdog may end this process
    if device != "cpu":  # our group's own backend for a GPU, though both ranks share it
        try:
            nccl = weight_push(shape, dtype, device, args.rounds, "nccl", wait_s=120)
            push["nccl_same_gpu"] = nccl
            print(f"weight push (nccl, two ranks on one GPU): {nccl['push_s']:.3f} s", flush=True)
        except Exception as exc:  # NCCL refuses two ranks on one device
            push["nccl_same_gpu"] = f"{type(exc).__name__}: {exc}"
            print(f"weight push (nccl, two ranks on one GPU): refused: {exc}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
