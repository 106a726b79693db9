"""`Trainer(config).train(workflow=...)`: rollouts through the gateway, then policy updates.

One step: run `group_size` copies of the agent on each of `batch_size` prompts, each
in its own gateway session; turn the recorded sessions into samples; compute GRPO
advantages within each prompt's group; take one DeepSpeed optimizer step on the packed
samples; push the new weights to the engine (policy version + 1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from tqdm.auto import tqdm

from gateway.config import GatewayConfig
from gateway.engines.model_source import load_tokenizer, resolve_model_dir
from gateway.server import BackgroundGateway
from trainer.advantages import grpo_advantages
from trainer.config import TrainerConfig, load_config
from trainer.datasets import load_dataset
from trainer.gateway_client import GatewayAdmin
from trainer.losses import ppo_clip_loss, reinforce_loss
from trainer.malloc import limit_arenas, release_free_memory
from trainer.packing import pack
from trainer.rollout import Episode, RolloutRunner
from trainer.run_log import RunLog, mean
from trainer.workflow import make_workflow

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_dir: Path
    database: Path
    metrics: Path
    reward_curve: Path
    checkpoint: Path
    first_reward: float | None
    last_reward: float | None
    policy_version: int


class Trainer:
    def __init__(self, config: TrainerConfig | dict[str, Any] | str | Path | None = None) -> None:
        if isinstance(config, (str, Path)):
            config = load_config(config)
        elif isinstance(config, dict):
            from trainer.config import _build

            config = _build(TrainerConfig, config, "")
        self.config: TrainerConfig = config or TrainerConfig()
        self.gateway: BackgroundGateway | None = None
        self.policy = None

    # ---- public ----------------------------------------------------------------------
    def train(
        self, workflow: Any = None, dataset: list[dict[str, Any]] | None = None
    ) -> TrainResult:
        cfg = self.config
        workflow = workflow if workflow is not None else cfg.workflow
        if workflow is None:
            raise ValueError(
                "no workflow: pass train(workflow='module.Class') or set `workflow` in the config"
            )
        agent = make_workflow(workflow, cfg.workflow_kwargs)
        rows = dataset if dataset is not None else load_dataset(cfg.dataset)
        if not rows:
            raise ValueError("the dataset is empty")
        if cfg.rollout.agent.mode != "inline":
            raise ValueError(
                f"rollout.agent.mode {cfg.rollout.agent.mode!r} is not supported yet; use 'inline'"
            )

        run_dir = Path(cfg.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        database = Path(cfg.gateway.database or run_dir / "sessions.db")
        runlog = RunLog(run_dir)
        if runlog.metrics_path.exists():
            runlog.metrics_path.unlink()

        random.seed(cfg.seed)
        limit_arenas(2)
        import torch

        torch.manual_seed(cfg.seed)
        model_dir = resolve_model_dir(cfg.model)
        admin_key = cfg.gateway.admin_key or secrets.token_urlsafe(24)
        gw_cfg = GatewayConfig(
            host=cfg.gateway.host,
            port=cfg.gateway.port,
            database=str(database),
            admin_key=admin_key,
            engine="embedded",
            model=str(model_dir),
            device=cfg.device,
            max_batch_size=cfg.gateway.max_batch_size,
            default_max_tokens=cfg.gateway.default_max_tokens,
        )
        self.gateway = BackgroundGateway(gw_cfg).start()
        try:
            from trainer.ds_engine import DeepSpeedPolicy

            self.policy = DeepSpeedPolicy(model_dir, cfg.train, cfg.device)
            asyncio.run(self._loop(agent, rows, admin_key, runlog))
            checkpoint = self.policy.save_hf(run_dir / "checkpoint", load_tokenizer(model_dir))
        finally:
            self.gateway.stop()
        curve = runlog.plot_rewards()
        k = max(1, min(3, len(runlog.rows) // 3 or 1))
        first = mean(
            [r["reward_mean"] for r in runlog.rows[:k] if r.get("reward_mean") is not None]
        )
        last = mean(
            [r["reward_mean"] for r in runlog.rows[-k:] if r.get("reward_mean") is not None]
        )
        return TrainResult(
            run_dir,
            database,
            runlog.metrics_path,
            curve,
            checkpoint,
            first,
            last,
            self.gateway.engine.version,
        )

    # ---- the loop --------------------------------------------------------------------
    async def _loop(
        self, agent: Any, rows: list[dict[str, Any]], admin_key: str, runlog: RunLog
    ) -> None:
        cfg = self.config
        assert self.gateway is not None and self.policy is not None
        # One thread for all training work: one allocator arena, not one per step.
        train_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="train")
        loop = asyncio.get_running_loop()
        limits = httpx.Limits(
            max_connections=cfg.rollout.max_concurrent * 2,
            max_keepalive_connections=cfg.rollout.max_concurrent * 2,
        )
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as http:
            runner = RolloutRunner(
                GatewayAdmin(self.gateway.url, admin_key, http),
                self.gateway.url,
                agent,
                http,
                export_style=cfg.rollout.agent.export_style,
                turn_discount=cfg.rollout.agent.turn_discount,
                max_concurrent=cfg.rollout.max_concurrent,
            )
            order = list(range(len(rows)))
            rng = random.Random(cfg.seed)
            rng.shuffle(order)
            cursor = 0
            bar = tqdm(range(cfg.total_steps), desc="training", unit="step", dynamic_ncols=True)
            for step in bar:
                batch = []
                for _ in range(cfg.rollout.batch_size):
                    if cursor == len(order):
                        rng.shuffle(order)
                        cursor = 0
                    batch.append(rows[order[cursor]])
                    cursor += 1
                t0 = time.perf_counter()
                groups = await asyncio.gather(
                    *(
                        runner.run_group(
                            data, step * cfg.rollout.batch_size + i, cfg.rollout.group_size
                        )
                        for i, data in enumerate(batch)
                    )
                )
                episodes = [ep for g in groups for ep in g]
                rollout_s = time.perf_counter() - t0
                stats = await loop.run_in_executor(train_thread, self._update, episodes)
                t1 = time.perf_counter()
                version = self.gateway.engine.update_weights(
                    self.policy.full_state_dict(), version=step + 1
                )  # type: ignore[attr-defined]
                release_free_memory()
                sync_s = time.perf_counter() - t1
                row = self._metrics(step, version, episodes, stats, rollout_s, sync_s)
                runlog.append(row)
                bar.set_postfix(
                    reward=f"{row['reward_mean']:.3f}" if row["reward_mean"] is not None else "n/a",
                    tokens=int(row.get("trained_tokens", 0)),
                )
                if (
                    cfg.save_every
                    and (step + 1) % cfg.save_every == 0
                    and step + 1 < cfg.total_steps
                ):
                    await loop.run_in_executor(
                        train_thread,
                        self.policy.save_hf,
                        Path(cfg.run_dir) / f"checkpoint-step{step + 1}",
                    )
            bar.close()
            train_thread.shutdown()

    def _update(self, episodes: list[Episode]) -> dict[str, float]:
        cfg = self.config
        assert self.policy is not None
        samples = [s for ep in episodes for s in ep.samples]
        groups = [ep.group for ep in episodes for _ in ep.samples]
        if not samples:
            return {"num_samples": 0.0}
        advantages = grpo_advantages([s["returns"] for s in samples], groups, cfg.train.adv_norm)
        # samples with zero advantage add nothing to the gradient; skip their compute
        keep = [i for i, a in enumerate(advantages) if abs(a) > 1e-8]
        stats: dict[str, float] = {
            "num_samples": float(len(samples)),
            "num_trained_samples": float(len(keep)),
        }
        if not keep:
            return stats
        batches = pack(
            [samples[i] for i in keep], [advantages[i] for i in keep], cfg.train.micro_batch_tokens
        )
        if cfg.train.algorithm == "grpo":

            def loss_fn(logp, mb):  # type: ignore[no-untyped-def]
                return ppo_clip_loss(
                    logp, mb.old_logprobs, mb.advantages, mb.loss_mask, cfg.train.eps_clip
                )
        elif cfg.train.algorithm == "reinforce":

            def loss_fn(logp, mb):  # type: ignore[no-untyped-def]
                return reinforce_loss(logp, mb.advantages, mb.loss_mask)
        else:
            raise ValueError(f"unknown train.algorithm {cfg.train.algorithm!r}: grpo or reinforce")
        stats.update(self.policy.train_step(batches, loss_fn))
        return stats

    @staticmethod
    def _metrics(
        step: int,
        version: int,
        episodes: list[Episode],
        stats: dict[str, float],
        rollout_s: float,
        sync_s: float,
    ) -> dict[str, Any]:
        rewards = [ep.reward for ep in episodes if ep.reward is not None]
        completions = sum(ep.num_completions for ep in episodes)
        return {
            "step": step + 1,
            "policy_version": version,
            "reward_mean": mean(rewards),
            "reward_max": max(rewards) if rewards else None,
            "episodes": len(episodes),
            "episode_errors": sum(1 for ep in episodes if ep.error),
            "episodes_without_reward": sum(1 for ep in episodes if ep.no_reward),
            "completions": completions,
            "turns_per_episode": completions / max(1, len(episodes)),
            "rollout_s": rollout_s,
            "weight_sync_s": sync_s,
            **stats,
        }
