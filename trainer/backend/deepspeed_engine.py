"""The policy under training, run by DeepSpeed (ZeRO 0-3; gloo on CPU, NCCL on GPUs).

It implements `TrainEngine`: every algorithm, the built-in actor's and a user's alike,
trains through `train_batch`, which packs the batch, gives each rank its share of the
micro-batches, accumulates their gradients and takes one optimizer step.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gateway.inference.model_source import load_causal_lm
from trainer.api.config import TrainConfig
from trainer.api.train_engine import LossFn, LossWeightFn, TrainEngine
from trainer.backend import distributed
from trainer.backend.batches import micro_batches, split_padded
from trainer.backend.functional import forward_logits

log = logging.getLogger(__name__)

MicroBatch = dict[str, torch.Tensor]


def init_distributed(device: str) -> None:
    """Single-process runs get a one-rank world; launched runs keep the launcher's env."""
    import deepspeed

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


def lr_factor(update: int, cfg: TrainConfig) -> float:
    """The multiple of `train.lr` that update `update` (from 0) runs at.

    Warm-up: update k (from 1) runs at k / (warmup_steps + 1) of the rate until the full
    rate; Adam's first updates are about lr in size whatever the gradient's, so with a
    few noisy samples a step one bad early step can carry the policy off. Then, with
    `lr_schedule: cosine`, a half cosine from 1 down to `min_lr_ratio` at update
    `lr_decay_steps` (held there after it), so the late steps of a run that has found
    the task move it less.
    """
    warm = cfg.warmup_steps
    if update < warm:
        return (update + 1) / (warm + 1)
    if cfg.lr_schedule != "cosine" or cfg.lr_decay_steps <= warm + 1:
        return 1.0
    progress = min(1.0, (update - warm) / (cfg.lr_decay_steps - 1 - warm))
    floor = cfg.min_lr_ratio
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class DeepSpeedEngine(TrainEngine):
    def __init__(self, model_dir: Path, cfg: TrainConfig, device: str = "cpu") -> None:
        import deepspeed

        if cfg.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"train.zero_stage must be 0, 1, 2 or 3; got {cfg.zero_stage}")
        init_distributed(device)
        self.cfg = cfg
        model = load_causal_lm(model_dir, device)
        # train in fp32: bf16 matmuls are ~30x slower on this kind of CPU
        model = model.float()
        model.config.use_cache = False
        model.train()
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        # DeepSpeed's own engine object, wrapping the model (not our TrainEngine); it steps
        # the scheduler after every optimizer update
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: lr_factor(done, cfg))
        config = {
            "train_micro_batch_size_per_gpu": 1,  # accumulation: train_batch's boundaries
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            # our client AdamW: DeepSpeed's fused/CPU Adam would JIT-compile for a minute
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        self.ds_engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, lr_scheduler=schedule
        )
        self._device = next(self.ds_engine.module.parameters()).device
        self.global_step = 0
        self.rank = distributed.rank()
        self.world = distributed.world_size()

    @property
    def module(self) -> torch.nn.Module:
        return self.ds_engine.module

    def train(self, mode: bool = True) -> DeepSpeedEngine:
        self.ds_engine.train(mode)
        return self

    # ---- TrainEngine -----------------------------------------------------------------
    def train_batch(
        self, data: dict[str, torch.Tensor], loss_fn: LossFn, loss_weight_fn: LossWeightFn
    ) -> dict[str, float]:
        """Every rank gets the same `data` and trains its share of the micro-batches."""
        started = time.perf_counter()
        mbs, weights = self._micro_batches(data, loss_weight_fn)
        sizes = [int(mb["input_ids"].numel()) for mb in mbs]
        out = {
            "trained_tokens": float(
                sum(float(mb["loss_mask"].sum()) for mb in mbs if "loss_mask" in mb)
            ),
            "micro_batches": float(len(mbs)),
            "packed_tokens": float(sum(sizes)),
        }
        total = sum(weights)
        if total <= 0:
            return {"loss": 0.0, **out}
        mine = distributed.shard(list(zip(mbs, weights, strict=True)), sizes, self.rank, self.world)
        sums = {"loss": 0.0}  # this rank's share of the loss and of the loss's stats
        for i, item in enumerate(mine):
            self.ds_engine.set_gradient_accumulation_boundary(i == len(mine) - 1)
            loss = self._share_of_loss(item, loss_fn, total, sums)
            # DeepSpeed averages gradients over ranks: scale up so the sum is the loss
            self.ds_engine.backward(loss * self.world)
            sums["loss"] += float(loss.detach())
        lr = float(self.optimizer.param_groups[0]["lr"])  # this update's, before the schedule moves
        grad_norm = self._step()
        out.update(self._sum_over_ranks(sums), train_s=time.perf_counter() - started, lr=lr)
        if grad_norm is not None:
            out["grad_norm"] = grad_norm
        return out

    def eval_batch(
        self, data: dict[str, torch.Tensor], loss_fn: LossFn, loss_weight_fn: LossWeightFn
    ) -> float:
        mbs, weights = self._micro_batches(data, loss_weight_fn)
        total = sum(weights) or 1.0
        with torch.no_grad():
            return sum(
                float(_run_loss(loss_fn, self.ds_engine, mb)[0]) * w / total
                for mb, w in zip(mbs, weights, strict=True)
            )

    def _micro_batches(
        self, data: dict[str, torch.Tensor], loss_weight_fn: LossWeightFn
    ) -> tuple[list[MicroBatch], list[float]]:
        mbs = [
            {k: v.to(self._device) for k, v in mb.items()}
            for mb in micro_batches(
                split_padded(data), self.cfg.micro_batch_tokens, self.cfg.share_prefixes
            )
        ]
        return mbs, [float(loss_weight_fn(mb)) for mb in mbs]

    def _share_of_loss(
        self,
        item: tuple[MicroBatch, float] | None,
        loss_fn: LossFn,
        total: float,
        sums: dict[str, float],
    ) -> torch.Tensor:
        if item is None:  # a stand-in keeping ranks in step: a real pass that moves nothing
            two = torch.arange(2, device=self._device)  # any two tokens
            return forward_logits(self.ds_engine, {"input_ids": two, "position_ids": two}).sum() * 0
        mb, weight = item
        loss, stats = _run_loss(loss_fn, self.ds_engine, mb)
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + float(v) * weight / total
        return loss * (weight / total)

    def _step(self) -> float | None:
        """One optimizer step; returns this step's gradient norm, before clipping.

        ZeRO 1-3 compute the norm inside `step()`; without ZeRO DeepSpeed does not
        report it, so it is taken before, from the whole gradients every rank holds.
        """
        own = None
        if self.cfg.zero_stage == 0:
            grads = [p.grad for p in self.ds_engine.module.parameters() if p.grad is not None]
            own = float(torch.nn.utils.get_total_norm(grads)) if grads else None
        self.ds_engine.step()
        self.global_step += 1
        reported = self.ds_engine.get_global_grad_norm()
        return own if reported is None else float(reported)

    def _sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        """Per key, the sum over ranks (a rank that only padded has no stats keys)."""
        if self.world == 1:
            return values
        gathered: list[dict[str, float]] = [{} for _ in range(self.world)]
        dist.all_gather_object(gathered, values)
        keys = sorted({k for g in gathered for k in g})
        return {k: sum(g.get(k, 0.0) for g in gathered) for k in keys}

    # ---- weights and checkpoints -----------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Whole (unpartitioned) weights, e.g. to push to the inference engine.

        Collective under ZeRO-3: every rank must call it.
        """
        module = self.ds_engine.module
        if self.cfg.zero_stage == 3:
            import deepspeed

            params = list(module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                return {k: v.detach().clone() for k, v in module.state_dict().items()}
        return {k: v.detach() for k, v in module.state_dict().items()}

    def frozen_copy(self) -> torch.nn.Module:
        """The current weights as a separate model in eval mode that trains nothing: the
        reference policy a KL penalty holds the run to. Collective under ZeRO-3."""
        from transformers import AutoModelForCausalLM

        module = self.ds_engine.module
        copy = AutoModelForCausalLM.from_config(module.config, dtype=torch.float32)
        copy.load_state_dict(self.full_state_dict(), strict=False)
        copy.tie_weights()
        return copy.to(self._device).eval().requires_grad_(False)

    def save_hf(self, path: Path, tokenizer: Any = None) -> Path:
        """A plain Hugging Face folder that the gateway (or anyone) can load."""
        path.mkdir(parents=True, exist_ok=True)
        state = self.full_state_dict()
        if self.rank == 0:
            self.ds_engine.module.save_pretrained(path, state_dict=state)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        return path

    def save_checkpoint(self, path: Path, client_state: dict[str, Any]) -> None:
        """DeepSpeed's own checkpoint (weights, optimizer shards); collective."""
        tag = f"step{client_state.get('step', self.global_step)}"
        self.ds_engine.save_checkpoint(
            str(path), tag=tag, client_state={**client_state, "global_step": self.global_step}
        )

    def load_checkpoint(self, path: Path) -> dict[str, Any] | None:
        if not (Path(path) / "latest").is_file():
            return None
        load_path, client_state = self.ds_engine.load_checkpoint(str(path))
        if load_path is None:
            return None
        client_state = dict(client_state or {})
        self.global_step = int(client_state.get("global_step", 0))
        return client_state


def _run_loss(
    loss_fn: LossFn, model: torch.nn.Module, mb: MicroBatch
) -> tuple[torch.Tensor, dict[str, float]]:
    """`loss_fn` on `model`'s logits for `mb`, as (loss, stats) whether it returned stats."""
    result = loss_fn(forward_logits(model, mb), mb)
    return result if isinstance(result, tuple) else (result, {})
