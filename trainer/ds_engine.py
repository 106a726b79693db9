"""The policy under training, run by DeepSpeed (ZeRO 0-3; gloo on CPU, NCCL on GPUs).

Two ways in: `train_step` is the built-in path (GRPO / decoupled PPO / REINFORCE on
samples from the gateway, with only the trained positions sent through the LM head);
`train_batch` is the TrainEngine API for user-written losses over full logits.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gateway.inference.model_source import load_causal_lm
from trainer import distributed
from trainer.batch_dicts import micro_batches, split_padded
from trainer.config import TrainConfig
from trainer.packing import PackedBatch, padding_batch, token_logprobs
from trainer.train_engine import LossFn as DictLossFn
from trainer.train_engine import LossWeightFn, TrainEngine

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


class DeepSpeedEngine(TrainEngine):
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
        self._pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(cfg)
        )
        self.global_step = 0
        self.rank = distributed.rank()
        self.world = distributed.world_size()

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def train(self, mode: bool = True) -> DeepSpeedEngine:
        self.engine.train(mode)
        return self

    # ---- the built-in path -----------------------------------------------------------
    def train_step(
        self, batches: list[PackedBatch], loss_fn: LossFn, recompute_prox: bool = False
    ) -> dict[str, float]:
        """One optimizer step over all micro-batches (gradients accumulate in between).

        Every rank gets the same `batches` and trains its own share. With
        `recompute_prox`, each micro-batch first gets the current (pre-step) weights'
        logprobs: the proximal policy of the decoupled PPO loss.
        """
        started = time.perf_counter()
        total = sum(float(b.loss_mask.sum()) for b in batches)
        if total == 0:
            return {"loss": 0.0, "trained_tokens": 0.0}
        mine = distributed.shard(batches, [b.num_tokens for b in batches], self.rank, self.world)
        merged: dict[str, float] = {}

        def loss_of(mb: PackedBatch | None) -> torch.Tensor:
            mb = mb if mb is not None else padding_batch(self._pad_id)
            if recompute_prox:
                with torch.no_grad():
                    mb.prox_logprobs = token_logprobs(self.engine, mb).cpu()
            logp = token_logprobs(self.engine, mb)
            if mb.is_padding:
                return logp.sum() * 0.0
            loss_sum, stats = loss_fn(logp, mb)
            weight = float(mb.loss_mask.sum()) / total
            for k, v in stats.items():
                merged[k] = merged.get(k, 0.0) + v * weight
            return loss_sum / total  # every token of the step weighs the same

        return self._step_over(
            mine,
            loss_of,
            started,
            {
                "trained_tokens": total,
                "packed_tokens": float(sum(b.num_tokens for b in batches)),
                "micro_batches": float(len(batches)),
            },
            merged,
        )

    # ---- the TrainEngine API ----------------------------------------------------------
    def train_batch(
        self,
        data: dict[str, torch.Tensor],
        loss_fn: DictLossFn,
        loss_weight_fn: LossWeightFn,
    ) -> dict[str, float]:
        started = time.perf_counter()
        mbs = micro_batches(split_padded(data), self.cfg.micro_batch_tokens)
        weights = [float(loss_weight_fn(mb)) for mb in mbs]
        total = sum(weights)
        if total <= 0:
            return {"loss": 0.0, "micro_batches": float(len(mbs))}
        sizes = [int(mb["input_ids"].numel()) for mb in mbs]
        mine = distributed.shard(list(zip(mbs, weights, strict=True)), sizes, self.rank, self.world)

        def loss_of(item: tuple[dict[str, torch.Tensor], float] | None) -> torch.Tensor:
            if item is None:
                return self._logits(self._padding_dict()).sum() * 0.0
            mb, w = item
            return loss_fn(self._logits(mb), mb) * (w / total)

        trained = (
            float(sum(float(mb["loss_mask"].sum()) for mb in mbs)) if "loss_mask" in mbs[0] else 0.0
        )
        return self._step_over(
            mine,
            loss_of,
            started,
            {
                "trained_tokens": trained,
                "micro_batches": float(len(mbs)),
                "packed_tokens": float(sum(sizes)),
            },
        )

    def eval_batch(
        self,
        data: dict[str, torch.Tensor],
        loss_fn: DictLossFn,
        loss_weight_fn: LossWeightFn,
    ) -> float:
        mbs = micro_batches(split_padded(data), self.cfg.micro_batch_tokens)
        weights = [float(loss_weight_fn(mb)) for mb in mbs]
        total = sum(weights) or 1.0
        with torch.no_grad():
            return sum(
                float(loss_fn(self._logits(mb), mb)) * w / total
                for mb, w in zip(mbs, weights, strict=True)
            )

    def _logits(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        device = next(self.engine.module.parameters()).device
        out = self.engine(
            input_ids=mb["input_ids"].long().unsqueeze(0).to(device),
            position_ids=mb["position_ids"].long().unsqueeze(0).to(device),
            use_cache=False,
        )
        return out.logits[0].float()

    def _padding_dict(self) -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.tensor([self._pad_id, self._pad_id]),
            "position_ids": torch.tensor([0, 1]),
        }

    # ---- shared ----------------------------------------------------------------------
    def _step_over(
        self,
        mine: list[Any],
        loss_of: Callable[[Any], torch.Tensor],
        started: float,
        sizes: dict[str, float],
        extra: dict[str, float] | None = None,
    ) -> dict[str, float]:
        """Backward through this rank's micro-batches (None = padding), then one step."""
        local_loss = 0.0
        for i, item in enumerate(mine):
            self.engine.set_gradient_accumulation_boundary(i == len(mine) - 1)
            # DeepSpeed averages gradients over ranks: scale up so the sum is the loss
            loss = loss_of(item) * self.world
            self.engine.backward(loss)
            local_loss += float(loss.detach()) / self.world
        grad_norm = self._step()
        out = {
            "loss": self._sum_over_ranks(local_loss),
            **sizes,
            "train_s": time.perf_counter() - started,
            **(extra or {}),
        }
        if grad_norm is not None:
            out["grad_norm"] = grad_norm
        return out

    def _step(self) -> float | None:
        grad_norm = (
            self.engine.get_global_grad_norm()
            if hasattr(self.engine, "get_global_grad_norm")
            else None
        )
        self.engine.step()
        self.global_step += 1
        return None if grad_norm is None else float(grad_norm)

    def _sum_over_ranks(self, value: float) -> float:
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Whole (unpartitioned) weights, e.g. to push to the inference engine.

        Collective under ZeRO-3: every rank must call it.
        """
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
        if self.rank == 0:
            self.engine.module.save_pretrained(path, state_dict=state)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        return path

    def save_checkpoint(self, path: Path, client_state: dict[str, Any]) -> None:
        """DeepSpeed's own checkpoint (weights, optimizer shards); collective."""
        tag = f"step{client_state.get('step', self.global_step)}"
        self.engine.save_checkpoint(
            str(path), tag=tag, client_state={**client_state, "global_step": self.global_step}
        )

    def load_checkpoint(self, path: Path) -> dict[str, Any] | None:
        if not (Path(path) / "latest").is_file():
            return None
        load_path, client_state = self.engine.load_checkpoint(str(path))
        if load_path is None:
            return None
        client_state = dict(client_state or {})
        self.global_step = int(client_state.get("global_step", 0))
        return client_state


# The name the first releases used.
DeepSpeedPolicy = DeepSpeedEngine
