"""The policy under training, run by DeepSpeed (ZeRO 0-3; gloo on CPU, NCCL on GPUs)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gateway.engines.model_source import load_causal_lm
from trainer.config import TrainConfig
from trainer.packing import PackedBatch, token_logprobs

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, PackedBatch], tuple[torch.Tensor, dict[str, float]]]


def init_distributed(device: str) -> None:
    """Single-process runs get a one-rank world; launched runs keep the launcher's env."""
    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        from gateway.server import free_port

        os.environ["MASTER_PORT"] = str(free_port())
    deepspeed.init_distributed(dist_backend="gloo" if device == "cpu" else "nccl", verbose=False)


def deepspeed_config(cfg: TrainConfig) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        # our client AdamW: DeepSpeed's fused/CPU Adam would JIT-compile for a minute
        "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedPolicy:
    def __init__(self, model_dir: Path, cfg: TrainConfig, device: str = "cpu") -> None:
        import deepspeed

        if cfg.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"train.zero_stage must be 0, 1, 2 or 3; got {cfg.zero_stage}")
        init_distributed(device)
        self.cfg = cfg
        self.device = device
        model = load_causal_lm(model_dir, device)
        # train in fp32: bf16 matmuls are ~30x slower on this kind of CPU
        model = model.float()
        model.config.use_cache = False
        model.train()
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(cfg)
        )
        self.global_step = 0

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def train_step(self, batches: list[PackedBatch], loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step over all micro-batches (gradients accumulate in between)."""
        started = time.perf_counter()
        total = sum(float(b.loss_mask.sum()) for b in batches)
        if total == 0:
            return {"loss": 0.0, "trained_tokens": 0.0}
        loss_value = 0.0
        merged: dict[str, float] = {}
        for i, mb in enumerate(batches):
            self.engine.set_gradient_accumulation_boundary(i == len(batches) - 1)
            logp = token_logprobs(self.engine, mb)
            loss_sum, stats = loss_fn(logp, mb)
            loss = loss_sum / total
            self.engine.backward(loss)
            loss_value += float(loss.detach())
            weight = float(mb.loss_mask.sum()) / total
            for k, v in stats.items():
                merged[k] = merged.get(k, 0.0) + v * weight
        grad_norm = (
            self.engine.get_global_grad_norm()
            if hasattr(self.engine, "get_global_grad_norm")
            else None
        )
        self.engine.step()
        self.global_step += 1
        out = {
            "loss": loss_value,
            "trained_tokens": total,
            "packed_tokens": float(sum(b.num_tokens for b in batches)),
            "micro_batches": float(len(batches)),
            "train_s": time.perf_counter() - started,
            **merged,
        }
        if grad_norm is not None:
            out["grad_norm"] = float(grad_norm)
        return out

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Whole (unpartitioned) weights, e.g. to push to the inference engine."""
        module = self.engine.module
        if self.cfg.zero_stage == 3:
            import deepspeed

            params = list(module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().clone() for k, v in module.state_dict().items()}
        return {k: v.detach() for k, v in module.state_dict().items()}

    def save_hf(self, path: Path, tokenizer: Any = None) -> Path:
        """A plain Hugging Face folder that the gateway (or anyone) can load."""
        path.mkdir(parents=True, exist_ok=True)
        state = self.full_state_dict()
        if int(os.environ.get("RANK", "0")) == 0:
            self.engine.module.save_pretrained(path, state_dict=state)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        return path
