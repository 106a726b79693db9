"""Training configuration: a YAML file plus `key.sub=value` overrides from the command line."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.config import GatewayConfig


@dataclass
class AgentConfig:
    # inline | subproc (a process pool; the agent must pickle) | ray (Ray tasks, `ray:`)
    mode: str = "inline"
    turn_discount: float = 1.0
    export_style: str = "individual"  # individual | concat
    subproc_max_workers: int = 4
    # subproc, ray: an episode whose worker process or node died runs again in a new
    # session (the dead one is ended and never trained on), at most this many times
    max_retries: int = 1
    # ray: what each agent run asks of the cluster (CPUs, and custom resources such as
    # {sandbox: 1} that only some nodes offer)
    num_cpus: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)


@dataclass
class RayConfig:
    """The Ray cluster `rollout.agent.mode: ray` places agents on (trainer/rollout/ray_agents.py)."""

    # "auto", "host:6379" or "ray://host:10001"; None: RAY_ADDRESS, else a local cluster
    address: str | None = None


@dataclass
class RolloutConfig:
    batch_size: int = 4  # prompts per training step
    group_size: int = 8  # agent runs per prompt (the GRPO group)
    max_concurrent: int = 64  # agent runs in flight at once
    # How many policy versions rollouts may run ahead of training; 0 = synchronous.
    max_staleness: int = 0
    agent: AgentConfig = field(default_factory=AgentConfig)


@dataclass
class TrainConfig:
    # Registered names (trainer/algorithm): the loss (grpo = the decoupled PPO objective,
    # ppo, reinforce, or your own @register_loss) and the advantage estimator.
    loss: str = "grpo"
    advantage: str = "grpo"
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    eps_clip: float = 0.2
    # Cap on the behaviour/proximal importance weight of stale tokens (decoupled PPO).
    behav_imp_weight_cap: float = 5.0
    zero_stage: int = 0
    micro_batch_tokens: int = 1024
    # Run a prompt shared by several samples (a group's runs, a session's earlier turns)
    # through the model once per micro-batch; same gradients (prefix_sharing.py).
    share_prefixes: bool = True
    adv_norm: str = "group"  # group | batch | none
    # updates over which the learning rate rises linearly to `lr` (0: full from the first)
    warmup_steps: int = 0
    # After warm-up: "constant", or "cosine" down to `min_lr_ratio` x `lr` at the last
    # update. Guards against late drift: a policy that has found the task keeps moving
    # at full rate unless the rate falls, which is where a demo run collapsed (#30).
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.1
    # Updates the cosine spans; 0: the run's own (total_steps x ppo_n_minibatches).
    lr_decay_steps: int = 0
    # Weight of the KL penalty to the starting policy (the k3 estimator per trained
    # token, as TRL's GRPO `beta`). Nothing else pulls a policy back once every group
    # scores the same; with it > 0 every sample is trained, zero-advantage ones too, so
    # the pull acts on them. The KL itself is measured and logged even at 0.
    kl_coef: float = 0.0
    # Optimizer updates per training step (AReaL's `ppo_n_minibatches`): the step's
    # samples are split into this many parts, each one update, PPO-clipped against the
    # policy that generated them. More learning per rollout, at little extra compute.
    ppo_n_minibatches: int = 1

    def __post_init__(self) -> None:
        if self.ppo_n_minibatches < 1:
            raise ConfigError(f"train.ppo_n_minibatches must be >= 1, got {self.ppo_n_minibatches}")
        if self.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ConfigError(
                f"train.lr_schedule must be constant or cosine, got {self.lr_schedule!r}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.kl_coef < 0 or self.lr_decay_steps < 0:
            raise ConfigError(
                f"train.kl_coef and train.lr_decay_steps must be >= 0; got {self.kl_coef}, "
                f"{self.lr_decay_steps}"
            )

    # A DeepSpeedEngine subclass ("module.Class" / "file.py:Class") to train with, and
    # optionally its method that replaces the built-in actor: it gets each step's padded
    # batch and calls self.train_batch(batch, loss_fn, loss_weight_fn).
    engine_class: str | None = None
    step_method: str | None = None


@dataclass
class EvalConfig:
    """Held-out evaluation (trainer/evaluation.py); off while `dataset` is empty."""

    # held-out rows, in the same forms as the top-level `dataset`; rows that are also
    # training prompts are dropped
    dataset: dict[str, Any] = field(default_factory=dict)
    size: int = 64  # rows evaluated
    every: int = 0  # also every N steps; 0: before and after training only
    before: bool = True  # evaluate the starting policy before the first step
    success_reward: float = 1.0  # an episode at or above this reward counts as accurate
    temperature: float = 0.0  # forced on every eval request (0: greedy)
    # the agent's constructor arguments for evaluation, over `workflow_kwargs` (e.g. one
    # turn where accuracy is "right on the first try")
    workflow_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.size < 1 or self.every < 0:
            raise ConfigError(f"eval.size must be >= 1 and eval.every >= 0; got {self}")


@dataclass
class TrackersConfig:
    """Where the run's per-step metrics go besides metrics.jsonl (trainer/trackers/)."""

    # any of: tensorboard, wandb (offline by default), trackio; [] for none
    backends: list[str] = field(default_factory=lambda: ["tensorboard"])
    # options per backend, passed to its init: wandb.init(**wandb), trackio.init(**trackio)
    wandb: dict[str, Any] = field(default_factory=dict)
    trackio: dict[str, Any] = field(default_factory=dict)
    tensorboard: dict[str, Any] = field(default_factory=dict)  # {log_dir: ...}

    def __post_init__(self) -> None:
        from trainer.trackers import TRACKERS

        unknown = sorted(set(self.backends) - set(TRACKERS))
        if unknown:
            raise ConfigError(f"trackers.backends: unknown {unknown}; known: {sorted(TRACKERS)}")


@dataclass
class TrainerConfig:
    experiment_name: str = "turnstile"
    run_dir: str = "runs/turnstile"
    seed: int = 1
    model: str | None = None  # None = bundled SmolLM2-135M-Instruct; or a local HF folder
    device: str = "cpu"
    total_steps: int = 10
    workflow: str | None = None  # "module.Class" or "path/file.py:Class"
    workflow_kwargs: dict[str, Any] = field(default_factory=dict)
    # {type: jsonl, path: ...} or {type: python, function: "file.py:fn", ...} (datasets.py)
    dataset: dict[str, Any] = field(default_factory=dict)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # stop training when the next step (and the final evaluation) would not fit in
    # this many seconds of wall-clock; 0: no budget
    time_budget_s: float = 0.0
    # {probe_s, step_s, eval_s} measured on a reference machine: with them the run
    # times a short forward+backward here and prints how long it should take
    time_estimate: dict[str, float] = field(default_factory=dict)
    # the gateway the agents talk to (gateway/config.py); `model` and `device` are the
    # trainer's own, `database` defaults to <run_dir>/sessions.db
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    save_every: int = 0  # 0 = only at the end
    log_every: int = 1
    # Resume from the newest checkpoint in run_dir (step count, optimizer, data order).
    resume: bool = False
    checkpoint_every: int = 0  # DeepSpeed checkpoints for resume; 0 = only at the end
    trackers: TrackersConfig = field(default_factory=TrackersConfig)
    # false: leave tensorboard out of trackers.backends (kept for older configs)
    tensorboard: bool = True
    # Python files to import first (they may call register_agent / register_env).
    imports: list[str] = field(default_factory=list)
    # The queue-based agent API: a registered agent and environment, by name.
    agent: dict[str, Any] = field(default_factory=dict)  # {name: ..., args: {...}}
    env: dict[str, Any] = field(default_factory=dict)  # {name: ..., args: {...}}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def without_secrets(self) -> dict[str, Any]:
        """The configuration as the run folder and the trackers keep it: no admin or signing key."""
        config = self.to_dict()
        return {**config, "gateway": {**config["gateway"], "admin_key": None, "signing_keys": None}}

    def tracker_backends(self) -> list[str]:
        return [b for b in self.trackers.backends if self.tensorboard or b != "tensorboard"]


class ConfigError(ValueError):
    pass


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {where or 'config'}; known: {sorted(known)}"
        )
    kwargs = {}
    for name, value in data.items():
        f = known[name]
        sub = f.default_factory if dataclasses.is_dataclass(f.default_factory) else None  # type: ignore[arg-type]
        if sub is not None and dataclasses.is_dataclass(sub):
            kwargs[name] = _build(sub, value or {}, f"{where}.{name}".strip("."))
        elif name == "betas" and isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = _coerce(value, f.default, f"{where}.{name}".strip("."))
    return cls(**kwargs)


def _coerce(value: Any, default: Any, where: str) -> Any:
    """YAML reads `2e-6` as a string; numbers go by the type of the field's default."""
    if isinstance(default, bool) or default is None or value is None:
        return value
    if isinstance(default, (int, float)) and isinstance(value, str):
        try:
            return type(default)(float(value)) if isinstance(default, float) else int(value)
        except ValueError:
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    return value


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw) if raw != "" else None


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: list[str] | None = None
) -> TrainerConfig:
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        data = yaml.safe_load(p.read_text()) or {}
    for item in overrides or []:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k} is not a section")
        node[keys[-1]] = value
    return _build(TrainerConfig, data, "")
