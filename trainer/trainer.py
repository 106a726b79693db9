"""`Trainer(config).train(workflow=...)`: rollouts through the gateway, then policy updates.

Rank 0 runs the gateway (its inference engine serves the agents) and the rollouts;
finished groups of episodes become one batch, which every DeepSpeed rank trains on
(each its share); the new weights go back to the engine and the policy version goes
up. Rollouts keep going while a step trains, at most `rollout.max_staleness` versions
ahead (0 = synchronous). Three ways to write the rollout side are accepted:

- an agent with `async def run(self, data, **extra_kwargs)` that talks to the gateway
  over HTTP (OpenAI SDK, LangChain, ...), inline or in a process pool (`mode: subproc`);
- a `RolloutWorkflow` with `async def arun_episode(self, engine, data)` on token ids;
- a registered queue-based agent (`collect_trajectory`) and environment, by name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml
from tqdm.auto import tqdm

from gateway.inference.base import WeightUpdate
from gateway.inference.model_source import resolve_model_dir
from gateway.inference.registry import INFERENCE_ENGINES, engine_spec
from gateway.malloc import limit_arenas, release_free_memory
from gateway.samples import check_export_style
from trainer.algorithm.actor import PPOActor, to_sequences
from trainer.algorithm.advantages import get_advantage
from trainer.algorithm.losses import get_loss
from trainer.api.config import TrainerConfig, _build, load_config
from trainer.api.registry import make_agent, make_env
from trainer.backend import distributed
from trainer.backend.batches import pad_sequences
from trainer.backend.deepspeed_engine import DeepSpeedEngine
from trainer.backend.weight_push import WeightPush, load_folder
from trainer.datasets import load_dataset
from trainer.evaluation import Evaluator, held_out_rows
from trainer.health import CollapseWatch, answer_signals
from trainer.loading import WorkflowError, import_files, load_class, make_workflow
from trainer.machine_probe import estimate, probe_seconds
from trainer.rollout.agent_runner import AgentRunner, Episode, SessionSpec
from trainer.rollout.controller import RolloutController
from trainer.rollout.data_order import DataOrder
from trainer.rollout.engine import RolloutEngine
from trainer.rollout.gateways import GatewayActors, GatewayAdmin, RemoteGateways
from trainer.rollout.queue_agents import QueueAgentRunner
from trainer.rollout.token_episodes import TokenWorkflowRunner
from trainer.run_log import RunLog, mean
from trainer.trackers import make_trackers

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
    start_step: int = 0  # > 0 when the run resumed from a checkpoint
    evals: list[dict[str, Any]] = field(default_factory=list)  # held-out, in step order
    stopped_early: bool = False  # the time budget ended training before total_steps
    wall_s: float = 0.0  # from the call to `train` to its end, start-up included
    # with eval.every: the evaluation with the best held-out accuracy (step 0: the base
    # policy) and the folder its weights were kept in (None while the base was best)
    best_eval: dict[str, Any] | None = None
    best_checkpoint: Path | None = None


class Trainer:
    def __init__(self, config: TrainerConfig | dict[str, Any] | str | Path | None = None) -> None:
        if isinstance(config, (str, Path)):
            config = load_config(config)
        elif isinstance(config, dict):
            config = _build(TrainerConfig, config, "")
        self.config: TrainerConfig = config or TrainerConfig()
        self.gateway: Any = None  # gateway.server.BackgroundGateway on rank 0
        # gateway.urls: replicas the trainer did not start (trainer/rollout/gateways.py)
        self.remote: RemoteGateways | None = None
        self._gateway_actors: Any = None  # gateway.ray_replicas (gateways.py)
        self.policy: Any = None  # a TrainEngine (DeepSpeedEngine or the user's subclass)
        self.version = 0
        self._stopped_early = False
        self._model_dir: Path | None = None  # set by train(); checkpoints read its tokenizer
        self._push: Any = None  # weight_push.WeightPush to the gateways, on the first push
        self._started = time.perf_counter()
        self._best: tuple[dict[str, Any], Path | None] | None = None

    # ---- public ----------------------------------------------------------------------
    def train(
        self, workflow: Any = None, dataset: list[dict[str, Any]] | None = None
    ) -> TrainResult:
        cfg = self.config
        # the time budget counts from here: model loading and start-up are part of the run
        self._started = time.perf_counter()
        spec = self._rollout_spec(workflow)
        kind = spec[0]
        if dataset is None and not cfg.dataset:
            raise ValueError(
                "no dataset: pass train(dataset=rows), or set `dataset` in the config "
                "({type: jsonl, path: ...} or {type: python, function: 'file.py:fn'})"
            )
        rows = dataset if dataset is not None else load_dataset(cfg.dataset)
        if not rows:
            raise ValueError("the dataset is empty")
        eval_rows = self._eval_rows(kind, rows)
        order = DataOrder(len(rows), cfg.seed)
        run_dir = Path(cfg.run_dir)
        main = distributed.is_main()
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(
                yaml.safe_dump(cfg.without_secrets(), sort_keys=False)
            )
        database = Path(cfg.gateway.database or run_dir / "sessions.db")

        limit_arenas(2)
        import torch

        torch.manual_seed(cfg.seed)
        model_dir = self._model_dir = resolve_model_dir(cfg.model)
        admin_key = cfg.gateway.admin_key or secrets.token_urlsafe(24)
        runlog: RunLog | None = None
        try:
            if cfg.gateway.urls or cfg.gateway.ray_replicas:
                self.remote = self._remote_gateways(kind, model_dir, admin_key)
            elif main:
                self.gateway = self._start_gateway(model_dir, database, admin_key, run_dir)
                print(f"dashboard: {self._dashboard_url()}", flush=True)
            self.policy = self._make_policy(model_dir)
            start_step = self._resume(order)
            if main:
                self._announce_estimate(start_step, bool(eval_rows))
                options = asdict(cfg.trackers)
                trackers = make_trackers(
                    cfg.tracker_backends(), options, run_dir, cfg.without_secrets(), start_step
                )
                runlog = RunLog(run_dir, start_step=start_step, trackers=trackers)
                asyncio.run(self._main_loop(spec, rows, eval_rows, order, runlog, start_step))
            else:
                while self._train_step(None) is not None:
                    pass
            # rank 0 writes the folder, with the tokenizer the gateway already loaded
            tokenizer = self._tokenizer(model_dir) if main else None
            checkpoint = self.policy.save_hf(run_dir / "checkpoint", tokenizer)
        finally:
            if runlog is not None:
                runlog.close()
            if self._push is not None:
                self._push.shutdown()
            if self.gateway is not None:
                self.gateway.stop()
            if self._gateway_actors is not None:
                self._gateway_actors.stop()
        distributed.barrier()
        if not main:
            return TrainResult(
                run_dir, database, run_dir / "metrics.jsonl", run_dir, checkpoint, None, None,
                self.version, start_step,
            )  # fmt: skip
        assert runlog is not None
        curve = runlog.plot_rewards()
        k = max(1, min(3, len(runlog.rows) // 3 or 1))
        rewards = [r.get("reward_mean") for r in runlog.rows]
        return TrainResult(
            run_dir,
            database,
            runlog.metrics_path,
            curve,
            checkpoint,
            mean([r for r in rewards[:k] if r is not None]),
            mean([r for r in rewards[-k:] if r is not None]),
            self.version,
            start_step,
            list(runlog.evals),
            self._stopped_early,
            time.perf_counter() - self._started,
            *(self._best or (None, None)),
        )

    def evaluate(self, workflow: Any = None, checkpoint: str | Path | None = None) -> Any:
        """The held-out evaluation alone, of `checkpoint` (a HF folder) or of `model`.

        Needs no DeepSpeed: only the gateway and the agent. Writes
        `<run_dir>/eval-<checkpoint name or "base">.json` and returns the EvalResult.
        """
        cfg = self.config
        kind, agent = self._rollout_spec(workflow)
        train_rows = load_dataset(cfg.dataset) if cfg.dataset else []
        rows = self._eval_rows(kind, train_rows)
        if not rows:
            raise ValueError("eval.dataset is not set: name a held-out set to evaluate on")
        run_dir = Path(cfg.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        model_dir = Path(checkpoint) if checkpoint else resolve_model_dir(cfg.model)
        database = Path(cfg.gateway.database or run_dir / "sessions.db")
        self.gateway = self._start_gateway(model_dir, database, secrets.token_urlsafe(24))

        async def run() -> Any:
            async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as http:
                evaluator = self._make_evaluator(agent, http, rows)
                try:
                    return await evaluator.run(0, self.gateway.engine.version)
                finally:
                    await evaluator.runner.close()

        try:
            result = asyncio.run(run())
        finally:
            self.gateway.stop()
        label = Path(checkpoint).name if checkpoint else "base"
        out = run_dir / f"eval-{label}.json"
        out.write_text(json.dumps({"model": str(model_dir), **result.to_dict()}, indent=2))
        return result

    # ---- set-up ----------------------------------------------------------------------
    def _eval_rows(self, kind: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The held-out rows (none when evaluation is off)."""
        if not self.config.eval.dataset:
            return []
        if kind != "agent":
            raise ValueError(
                "eval: held-out evaluation runs agents through the gateway "
                "(`async def run(data, **extra_kwargs)`); this run has a token-level or queue agent"
            )
        return held_out_rows(self.config.eval, rows)

    def _rollout_spec(self, workflow: Any) -> tuple[str, Any]:
        """('queue', (agent, env)) | ('workflow', workflow) | ('agent', agent), after the
        config's `imports` (which may register agents, environments, export styles)."""
        cfg = self.config
        import_files(cfg.imports)
        check_export_style(cfg.rollout.agent.export_style, " (rollout.agent.export_style)")
        if cfg.agent:
            if workflow is not None or cfg.workflow:
                raise WorkflowError(
                    "set either `workflow` or `agent` (a registered agent), not both"
                )
            if "name" not in cfg.agent or "name" not in (cfg.env or {}):
                raise WorkflowError(
                    "a registered agent needs `agent: {name: ..., args: {...}}` and "
                    "`env: {name: ..., args: {...}}` in the config"
                )
            agent = make_agent(cfg.agent["name"], **(cfg.agent.get("args") or {}))
            env = make_env(cfg.env["name"], **(cfg.env.get("args") or {}))
            return "queue", (agent, env)
        workflow = workflow if workflow is not None else cfg.workflow
        if workflow is None:
            raise ValueError(
                "no workflow: pass train(workflow='module.Class'), or set `workflow` "
                "(an agent or RolloutWorkflow) or `agent` (a registered agent) in the config"
            )
        instance = make_workflow(workflow, cfg.workflow_kwargs)
        if asyncio.iscoroutinefunction(getattr(instance, "arun_episode", None)):
            return "workflow", instance
        return "agent", instance

    def _dashboard_url(self) -> str:
        """The /ui run page of this run. The key is in the URL only when the trainer made
        it up (it lives as long as the run); a configured key the user already has."""
        base = self.gateway.url.removesuffix("/v1")
        index = len(self.gateway.config.run_dirs) - 1
        url = f"{base}/ui/runs/{index}"
        if self.config.gateway.admin_key is None:
            url += f"?key={self.gateway.config.admin_key}"
        return url

    def _remote_gateways(self, kind: str, model_dir: Path, admin_key: str) -> RemoteGateways:
        """Replicas of one store: `gateway.urls` (already running) or `gateway.ray_replicas`
        (started here as Ray actors, by rank 0). Rank 0 checks each answers the admin
        key before training starts."""
        gw = self.config.gateway
        if kind != "agent":
            raise WorkflowError(
                "gateway.urls and gateway.ray_replicas serve agents over HTTP (`async def "
                "run(data, **extra_kwargs)`); token-level workflows and queue agents need "
                "the gateway the trainer starts"
            )
        if gw.urls and gw.ray_replicas:
            raise WorkflowError("set gateway.urls or gateway.ray_replicas, not both")
        if not gw.ray_replicas:
            remote = RemoteGateways(gw.urls, gw.admin_key)
        elif not distributed.is_main():  # only rank 0 talks to the gateways
            return RemoteGateways([], admin_key)
        else:
            settings = replace(gw, model=str(model_dir), device=self.config.device)
            self._gateway_actors = GatewayActors(
                gw.ray_replicas, settings, admin_key, self.config.ray.address, gw.ray_resources
            )
            remote = RemoteGateways(self._gateway_actors.urls, admin_key)
        if distributed.is_main():  # train() stops the actors if this fails
            versions = remote.check()
            print(f"gateways: {', '.join(remote.urls)} (policy versions {versions})", flush=True)
        return remote

    def _gateways(self) -> tuple[list[str], str]:
        """The URLs of the gateways the agents use (the trainer's own, or every one of
        `gateway.urls`) and their admin key."""
        if self.remote is not None:
            return self.remote.urls, self.remote.admin_key
        return [self.gateway.url], self.gateway.config.admin_key

    def _tokenizer(self, model_dir: Path | None) -> Any:
        """The tokenizer saved with checkpoints: the one the gateway loaded, else the model's."""
        if self.gateway is not None:
            return self.gateway.state.renderer.tokenizer
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_dir)

    def _start_gateway(
        self, model_dir: Path, database: Path, admin_key: str, run_dir: Path | None = None
    ) -> Any:
        from gateway.server import BackgroundGateway

        if not engine_spec(self.config.gateway.engine).trainable:
            trainable = sorted(n for n, s in INFERENCE_ENGINES.items() if s.trainable)
            raise ValueError(
                f"gateway.engine {self.config.gateway.engine!r} cannot take new weights; "
                f"choose one of {trainable}"
            )
        gw_cfg = replace(
            self.config.gateway,
            database=str(database),
            admin_key=admin_key,
            model=str(model_dir),
            device=self.config.device,
            # the /ui run page charts this run's metrics.jsonl while it trains
            run_dirs=[*self.config.gateway.run_dirs, *([str(run_dir)] if run_dir else [])],
        )
        return BackgroundGateway(gw_cfg).start()

    def _make_policy(self, model_dir: Path) -> Any:
        """The train engine; and, unless `train.step_method` names the user's own step,
        the built-in actor (`self.actor`) that trains each batch on it."""
        t = self.config.train
        cls = load_class(t.engine_class or DeepSpeedEngine, "train.engine_class")
        if not issubclass(cls, DeepSpeedEngine):
            raise WorkflowError(
                f"train.engine_class {cls.__name__} must subclass trainer.api.DeepSpeedEngine"
            )
        if t.step_method is not None and not callable(getattr(cls, t.step_method, None)):
            raise WorkflowError(
                f"{cls.__name__} has no method {t.step_method!r} (train.step_method)"
            )
        if t.step_method is None:  # an unknown loss or estimator fails before the model loads
            get_loss(t.loss)
            get_advantage(t.advantage)
        if t.lr_decay_steps == 0:  # the cosine spans the run's own updates
            t = replace(t, lr_decay_steps=self.config.total_steps * t.ppo_n_minibatches)
        policy = cls(model_dir, t, self.config.device)
        self.actor = PPOActor(policy, t) if t.step_method is None else None
        return policy

    def _checkpoint_dir(self) -> Path:
        return Path(self.config.run_dir) / "checkpoints"

    def _resume(self, order: DataOrder) -> int:
        """Restore step, optimizer and data order from the newest checkpoint, if asked."""
        if not self.config.resume:
            return 0
        state = self.policy.load_checkpoint(self._checkpoint_dir())
        if state is None:
            if distributed.is_main():
                log.warning("resume: no checkpoint in %s; starting fresh", self._checkpoint_dir())
            return 0
        step = int(state["step"])
        order.load(state["data"])
        self._sync_weights(step)
        if distributed.is_main():
            print(f"resumed from {self._checkpoint_dir()} at step {step}")
        return step

    # ---- rank 0 ----------------------------------------------------------------------
    async def _main_loop(
        self,
        spec: tuple[str, Any],
        rows: list[dict[str, Any]],
        eval_rows: list[dict[str, Any]],
        order: DataOrder,
        runlog: RunLog,
        start_step: int,
    ) -> None:
        """Rollouts and steps on rank 0: `spec` is `_rollout_spec`'s; `order` (kept in
        checkpoints, so a resumed run goes on where it stopped) says which of `rows` each
        group gets."""
        cfg = self.config
        started = self._started
        # One thread for all training work: one allocator arena, not one per step.
        train_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="train")
        loop = asyncio.get_running_loop()
        limits = httpx.Limits(
            max_connections=cfg.rollout.max_concurrent * 2,
            max_keepalive_connections=cfg.rollout.max_concurrent * 2,
        )
        async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as http:
            runner = self._make_runner(*spec, http)
            evaluator = self._make_evaluator(spec[1], http, eval_rows)

            async def evaluate(steps_done: int) -> None:
                if evaluator is None:
                    return
                result = await evaluator.run(steps_done, self.version)
                if result is None:
                    return
                runlog.append_eval(result.to_dict())
                tqdm.write(f"held-out eval after {steps_done} steps: {result.summary()}")
                if cfg.eval.every:
                    await loop.run_in_executor(train_thread, self._keep_best, result.to_dict())

            if evaluator is not None and evaluator.due(start_step):
                await evaluate(start_step)
            controller = RolloutController(
                runner.run_group, rows, order, cfg.rollout, version=start_step
            )
            controller.start()
            bar = tqdm(
                total=cfg.total_steps, initial=start_step, desc="training", unit="step",
                dynamic_ncols=True,
            )  # fmt: skip
            step_times: list[float] = []
            watch = CollapseWatch()
            try:
                for step in range(start_step, cfg.total_steps):
                    if step >= cfg.min_steps and self._over_budget(started, step_times, evaluator):
                        self._stopped_early = True
                        tqdm.write(
                            f"time budget ({cfg.time_budget_s:.0f} s) reached: stopping "
                            f"after {step} steps for the final evaluation"
                        )
                        break
                    t0 = time.perf_counter()
                    groups = await controller.next_batch()
                    wait_s = time.perf_counter() - t0
                    episodes = [ep for _, eps in groups for ep in eps]
                    payload = {
                        "step": step,
                        "data": order.state(),
                        "sequences": to_sequences(episodes),
                    }  # what every rank needs for the step (broadcast to the others)
                    stats = await loop.run_in_executor(train_thread, self._train_step, payload)
                    await controller.set_version(self.version)
                    row = self._metrics(
                        step, episodes, stats, wait_s, time.perf_counter() - t0,
                        sorted(order.row(g) for g, _ in groups),
                    )  # fmt: skip
                    runlog.append(row)
                    step_times.append(row["step_s"])
                    bar.update(1)
                    bar.set_postfix(_postfix(row))
                    warning = watch.check(row)
                    if warning:
                        tqdm.write(warning)
                        log.warning(warning)
                    if evaluator is not None and evaluator.due(step + 1):
                        await evaluate(step + 1)
                await controller.stop()  # the final evaluation has the engine to itself
                await evaluate(start_step + len(step_times))
                if self._best is not None:
                    tqdm.write(self._best_line())
            finally:
                bar.close()
                await controller.stop()
                for r in (runner, evaluator and evaluator.runner):
                    if hasattr(r, "close"):  # an AgentRunner: its subproc or Ray pool
                        await r.close()
                await loop.run_in_executor(train_thread, self._train_step, {"stop": True})
                train_thread.shutdown()

    def _keep_best(self, result: dict[str, Any]) -> None:
        """With `eval.every`: keep the weights of the best held-out accuracy so far in
        <run_dir>/checkpoint-best (with best.json saying which step). Later steps can
        be worse than earlier ones; a user should not have to guess which to keep."""
        best = self._best[0] if self._best else None
        if best is not None and result["accuracy"] <= best["accuracy"]:
            return
        folder = None
        if result["step"] > 0 and self.policy.world > 1 and self.config.train.zero_stage == 3:
            log.warning("best checkpoint not kept: ZeRO-3 gathers weights on every rank")
        elif result["step"] > 0:
            folder = Path(self.config.run_dir) / "checkpoint-best"
            self.policy.save_hf(folder, self._tokenizer(self._model_dir))
            (folder / "best.json").write_text(json.dumps(result, indent=2))
        self._best = (result, folder)

    def _best_line(self) -> str:
        best, folder = self._best  # type: ignore[misc]
        lo, hi = best["accuracy_ci"]
        where = f"kept in {folder}" if folder else "the base policy; no trained step beat it"
        return (
            f"best held-out accuracy: {best['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] after "
            f"{best['step']} steps, {where}"
        )

    def _announce_estimate(self, start_step: int, evaluating: bool) -> None:
        """Time a short forward+backward and say how long the run should take here."""
        cfg = self.config
        if not cfg.time_estimate or cfg.train.zero_stage == 3:
            return
        probe_s = probe_seconds(self.policy.module)
        est = estimate(probe_s, cfg.time_estimate)
        if est is None:
            return
        steps = cfg.total_steps - start_step
        fixed_evals = (1 + int(cfg.eval.before)) if evaluating else 0  # after, and before
        evals = fixed_evals + (steps // cfg.eval.every if evaluating and cfg.eval.every else 0)
        total = est.total_s(steps, evals)
        line = (
            f"machine probe: {probe_s:.2f} s per fwd+bwd of 256 tokens, {est.slowdown:.1f}x the "
            f"reference machine; estimated {total / 60:.0f} min for {steps} steps"
            + (f" and {evals} evaluations" if evals else "")
        )
        if cfg.time_budget_s and total > cfg.time_budget_s:
            line += f"; the {cfg.time_budget_s / 60:.0f} min budget will end it sooner"
            floor = min(cfg.min_steps, steps)
            floor_s = est.total_s(floor, fixed_evals)
            if floor_s > cfg.time_budget_s:
                line += f", but not before {floor} steps (min_steps): about {floor_s / 60:.0f} min"
        print(line, flush=True)

    def _over_budget(self, started: float, step_times: list[float], evaluator: Any) -> bool:
        """Would one more step, then the final evaluation, overrun `time_budget_s`?"""
        budget = self.config.time_budget_s
        if not budget or not step_times:
            return False
        step_s = sum(step_times[-3:]) / len(step_times[-3:])
        final_eval_s = evaluator.last_seconds if evaluator is not None else 0.0
        return time.perf_counter() - started + step_s + final_eval_s > budget

    def _make_evaluator(
        self, agent: Any, http: httpx.AsyncClient, rows: list[dict[str, Any]]
    ) -> Any:
        if not rows:
            return None
        cfg = self.config
        if cfg.eval.workflow_kwargs:
            agent = make_workflow(type(agent), {**cfg.workflow_kwargs, **cfg.eval.workflow_kwargs})
        greedy = SessionSpec(
            metadata={"eval": True}, sampling={"temperature": cfg.eval.temperature}, export=False
        )
        return Evaluator(cfg.eval, rows, self._agent_runner(agent, http, greedy))

    def _agent_runner(self, agent: Any, http: httpx.AsyncClient, sessions: SessionSpec) -> Any:
        """Agent runs in `sessions`, placed as `rollout.agent` says (inline, a process
        pool, Ray tasks)."""
        urls, admin_key = self._gateways()
        return AgentRunner(
            [GatewayAdmin(url, admin_key, http) for url in urls],
            agent,
            sessions=sessions,
            placement=self.config.rollout.agent,
            ray_address=self.config.ray.address,
            max_concurrent=self.config.rollout.max_concurrent,
        )

    def _make_runner(self, kind: str, agent: Any, http: httpx.AsyncClient) -> Any:
        cfg = self.config
        a = cfg.rollout.agent
        if kind == "agent":
            sessions = SessionSpec(export_style=a.export_style, turn_discount=a.turn_discount)
            return self._agent_runner(agent, http, sessions)
        engine = RolloutEngine.for_gateway(self.gateway, str(cfg.model or "default"))
        export = {
            "export_style": a.export_style,
            "turn_discount": a.turn_discount,
            "max_concurrent": cfg.rollout.max_concurrent,
        }
        if kind == "workflow":
            return TokenWorkflowRunner(agent, engine, **export)
        queue_agent, env = agent
        return QueueAgentRunner(queue_agent, env, engine, **export)

    # ---- every rank ------------------------------------------------------------------
    def _train_step(self, payload: dict[str, Any] | None) -> dict[str, float] | None:
        """Train one batch, publish the weights, checkpoint when due. Runs on all ranks."""
        payload = distributed.broadcast_object(payload)
        if payload.get("stop"):
            return None
        cfg = self.config
        step = int(payload["step"])
        seqs = payload["sequences"]
        if not seqs:
            stats: dict[str, float] = {"num_samples": 0.0}
        elif self.actor is not None:
            stats = self.actor.train(pad_sequences(seqs), version=step)
        else:  # the user's own step, which calls self.train_batch
            out = getattr(self.policy, cfg.train.step_method)(pad_sequences(seqs))
            stats = {k: float(v) for k, v in (out or {}).items() if _is_number(v)}
        t0 = time.perf_counter()
        self._sync_weights(step + 1)
        stats["weight_sync_s"] = time.perf_counter() - t0
        every = cfg.checkpoint_every
        if every and ((step + 1) % every == 0 or step + 1 == cfg.total_steps):
            t0 = time.perf_counter()
            self._save_checkpoint(step + 1, payload["data"])
            stats["checkpoint_s"] = time.perf_counter() - t0
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.total_steps:
            self.policy.save_hf(Path(cfg.run_dir) / f"checkpoint-step{step + 1}")
        release_free_memory()
        return stats

    def _sync_weights(self, version: int) -> None:
        """New weights to every engine, as `_weight_sync` says: a state dict in memory
        (an engine in this process), a push from rank 0 without disk (weight_push.py),
        or a Hugging Face folder each engine loads. Collective: every rank."""
        how = self._weight_sync()
        if how == "disk":
            path = Path(self.config.run_dir) / "weights" / f"v{version}"
            update = WeightUpdate(version, path=str(self.policy.save_hf(path)))
        else:
            update = WeightUpdate(version, state_dict=self.policy.full_state_dict())
        if distributed.is_main():
            if how == "push":  # to every gateway the agents use, in a group kept for the run
                if self._push is None:
                    self._push = WeightPush(*self._gateways())
                self._push.push(version, update.state_dict)
            elif self.remote is not None:
                assert update.path is not None
                load_folder(self.remote.urls, self.remote.admin_key, version, update.path)
            elif self.gateway is not None:
                self.gateway.call(self.gateway.engine.update_weights(update))
            if update.path is not None:
                for old in Path(update.path).parent.glob("v*"):
                    if old != Path(update.path):
                        shutil.rmtree(old, ignore_errors=True)
        self.version = version

    def _weight_sync(self) -> str:
        """memory | push | disk: `gateway.weight_sync`, or with auto the engine's own way
        (its registry entry); gateways the trainer did not start always get a push."""
        named = self.config.gateway.weight_sync
        if named == "disk":
            return "disk"
        if self.remote is not None:
            return "push"
        default = engine_spec(self.config.gateway.engine).weights
        if named == "push" and default == "disk":
            raise WorkflowError(
                f"the {self.config.gateway.engine!r} engine takes no weight push: "
                "set gateway.weight_sync: disk (or auto)"
            )
        return "push" if named == "push" else default

    def _save_checkpoint(self, step: int, data_state: dict[str, Any]) -> None:
        ckpt = self._checkpoint_dir()
        self.policy.save_checkpoint(ckpt, {"step": step, "data": data_state})
        distributed.barrier()
        if distributed.is_main():  # keep the newest only: each holds optimizer state
            for old in ckpt.glob("step*"):
                if old.name != f"step{step}":
                    shutil.rmtree(old, ignore_errors=True)

    # ---- metrics ---------------------------------------------------------------------
    def _metrics(
        self,
        step: int,
        episodes: list[Episode],
        stats: dict[str, float] | None,
        wait_s: float,
        step_s: float,
        data_rows: list[int],
    ) -> dict[str, Any]:
        rewards = [ep.reward for ep in episodes if ep.reward is not None]
        completions = sum(ep.num_completions for ep in episodes)
        samples = [s for ep in episodes for s in ep.samples]
        row: dict[str, Any] = {
            "step": step + 1,
            "policy_version": self.version,
            "reward_mean": mean(rewards),
            "reward_max": max(rewards) if rewards else None,
            "episodes": len(episodes),
            "episode_errors": sum(1 for ep in episodes if ep.error),
            # runs again after a worker or node died (subproc, ray)
            "episode_retries": sum(ep.retries for ep in episodes),
            "episodes_without_reward": sum(1 for ep in episodes if ep.no_reward),
            "completions": completions,
            "turns_per_episode": completions / max(1, len(episodes)),
            "rollout_wait_s": wait_s,
            "step_s": step_s,
            "world_size": distributed.world_size(),
            "data_rows": data_rows,
            # which sessions this step learned from: a resumed run never repeats one
            "sessions": [ep.session_id for ep in episodes],
        }
        if self.config.rollout.agent.export_style == "concat":
            row["concat_fallbacks"] = sum(
                int((s.get("meta") or {}).get("concat_fallbacks", 0)) for s in samples
            )
            row["concat_samples"] = len(samples)
        row.update(answer_signals(samples))
        row.update(stats or {})
        if row.get("train_s"):  # throughput of the update itself (the run page charts it)
            row["packed_tokens_per_s"] = row.get("packed_tokens", 0.0) / row["train_s"]
            row["trained_tokens_per_s"] = row.get("trained_tokens", 0.0) / row["train_s"]
        return row


def _postfix(row: dict[str, Any]) -> dict[str, str]:
    """The progress bar's view of a step: reward and the collapse signals."""
    shown = {"reward": "reward_mean", "ent": "entropy", "kl": "kl_ref", "cut": "truncated_frac"}
    return {
        name: "n/a" if row.get(key) is None else f"{row[key]:.3g}" for name, key in shown.items()
    }


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
