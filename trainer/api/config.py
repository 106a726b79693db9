"""Training configuration: a YAML file plus `key.sub=value` overrides from the command line."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.config import GatewayConfig, setting


@dataclass
class TrainerGatewayConfig(GatewayConfig):
    """The trainer's `gateway:` section: the settings of the gateway it starts, or
    (`urls`) the gateways it did not start (trainer/rollout/gateways.py)."""

    urls: list[str] = setting(
        [],
        "gateways the trainer does not start (`turnstile serve` replicas on one store, "
        "their /v1 URLs): each session sticks to one, every one gets the new weights "
        "(pushed without disk); `admin_key` is theirs. Empty: the trainer starts its own",
    )
    weight_sync: str = setting(
        "auto",
        "how each step's weights reach the engines: auto (an engine in the trainer's "
        "process takes them in memory; vLLM servers and gateway.urls get a push from rank "
        "0 without disk, gloo on CPU, NCCL on GPU; SGLang loads a folder), push, or disk "
        "(a Hugging Face folder under run_dir/weights that every engine loads: it must "
        "be readable where they run)",
    )
    ray_replicas: int = setting(
        0,
        "start this many gateway replicas as Ray actors (on the `ray.address` cluster, "
        "each bound to its node's address, all on the PostgreSQL `database`) and use "
        "them as `urls`; 0: none",
    )
    ray_resources: dict[str, float] = setting(
        {}, "what each of those replicas asks of the cluster, e.g. {gateway: 1}"
    )

    def __post_init__(self) -> None:
        if self.weight_sync not in ("auto", "push", "disk"):
            raise ConfigError(
                f"gateway.weight_sync must be auto, push or disk; got {self.weight_sync!r}"
            )


@dataclass
class AgentConfig:
    """How `run(data, **extra_kwargs)` agents are run and their sessions turned into samples."""

    mode: str = setting(
        "inline",
        "where each agent run happens: inline (on the trainer's event loop), subproc (a "
        "process pool; the agent must pickle) or ray (Ray tasks on the `ray:` cluster)",
    )
    turn_discount: float = setting(
        1.0, "gamma over a session's turns: a turn's return is the reward discounted back to it"
    )
    export_style: str = setting(
        "individual",
        "how a session becomes samples (a registered export style): individual (one per "
        "completion) or concat (one per branch of the conversation), or yours",
    )
    subproc_max_workers: int = setting(4, "subproc: worker processes in the pool")
    max_retries: int = setting(
        1,
        "subproc, ray: times an episode whose worker process or node died runs again, each "
        "in a new session (the dead one is ended and never trained on)",
    )
    num_cpus: float = setting(1.0, "ray: CPUs each agent run asks of the cluster")
    resources: dict[str, float] = setting(
        {}, "ray: custom resources each agent run asks for, e.g. {sandbox: 1} (only some nodes)"
    )


@dataclass
class RayConfig:
    """The Ray cluster `rollout.agent.mode: ray` places agents on (trainer/rollout/ray_agents.py)."""

    address: str | None = setting(
        None,
        'the cluster: "auto", "host:6379" or "ray://host:10001"; null: $RAY_ADDRESS, else '
        "a local cluster",
    )


@dataclass
class RolloutConfig:
    """How many episodes each step gets, and how far rollouts may run ahead of training."""

    batch_size: int = setting(4, "dataset rows (prompts) per training step")
    group_size: int = setting(8, "episodes per prompt: the group GRPO compares")
    max_concurrent: int = setting(64, "episodes in flight at once, across groups")
    max_staleness: int = setting(
        0,
        "policy versions rollouts may run ahead of training (stale tokens are corrected by "
        "the decoupled PPO loss); 0: synchronous",
    )
    agent: AgentConfig = setting(AgentConfig, "how agents run")


@dataclass
class TrainConfig:
    """The algorithm and the optimizer: what one training step does with its episodes."""

    loss: str = setting(
        "grpo",
        "a registered loss: grpo (the decoupled PPO objective, safe on stale tokens), ppo, "
        "reinforce, or yours (@register_loss)",
    )
    advantage: str = setting(
        "grpo", "a registered advantage estimator: grpo, or yours (@register_advantage)"
    )
    lr: float = setting(1e-5, "AdamW learning rate (the peak, after warm-up)")
    weight_decay: float = setting(0.0, "AdamW weight decay")
    betas: tuple[float, float] = setting((0.9, 0.999), "AdamW betas")
    grad_clip: float = setting(1.0, "largest gradient norm of an update; larger is scaled down")
    eps_clip: float = setting(
        0.2, "PPO clip: how far an update may move a token's probability ratio from 1"
    )
    behav_imp_weight_cap: float = setting(
        5.0,
        "cap on the behaviour/proximal importance weight of a stale token (decoupled PPO), "
        "so one very stale token cannot dominate a step",
    )
    zero_stage: int = setting(0, "DeepSpeed ZeRO stage, 0-3 (what is partitioned across ranks)")
    micro_batch_tokens: int = setting(
        1024, "most tokens packed into one micro-batch (one forward and backward), tokens"
    )
    share_prefixes: bool = setting(
        True,
        "run a prompt shared by several samples (a group's runs, a session's earlier turns) "
        "through the model once per micro-batch; same gradients (prefix_sharing.py)",
    )
    adv_norm: str = setting(
        "group", "what advantages are divided by: group (its std), batch (the step's) or none"
    )
    warmup_steps: int = setting(
        0,
        "updates over which the learning rate rises linearly to `lr` (update k runs at "
        "k/(warmup_steps+1) of it); 0: full from the first",
    )
    lr_schedule: str = setting(
        "constant",
        "after warm-up: constant, or cosine down to `min_lr_ratio` x `lr` at the last "
        "update; guards against late drift, where a policy that has found the task keeps "
        "moving at full rate (a demo run collapsed there, #30)",
    )
    min_lr_ratio: float = setting(0.1, "cosine: the final learning rate, as a fraction of `lr`")
    lr_decay_steps: int = setting(
        0, "cosine: updates it spans; 0: the run's own (total_steps x ppo_n_minibatches)"
    )
    kl_coef: float = setting(
        0.0,
        "weight of the KL penalty to the starting policy (k3 per trained token, as TRL's "
        "GRPO `beta`); above 0 every sample is trained, zero-advantage ones too, so the pull "
        "back acts on them; the KL is measured and logged even at 0",
    )
    ppo_n_minibatches: int = setting(
        1,
        "optimizer updates per training step: the step's samples are split into this many "
        "parts, each one update, PPO-clipped against the policy that generated them",
    )
    engine_class: str | None = setting(
        None,
        'a DeepSpeedEngine subclass to train with ("module.Class" or "file.py:Class"); '
        "null: DeepSpeedEngine",
    )
    step_method: str | None = setting(
        None,
        "a method of engine_class that replaces the built-in actor: it gets each step's "
        "padded batch and calls self.train_batch(batch, loss_fn, loss_weight_fn)",
    )

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


@dataclass
class EvalConfig:
    """Held-out evaluation (trainer/evaluation.py); off while `dataset` is empty."""

    dataset: dict[str, Any] = setting(
        {},
        "held-out rows, in the same forms as the top-level `dataset`; rows that are also "
        "training prompts are dropped; {}: no evaluation",
    )
    size: int = setting(64, "rows evaluated")
    every: int = setting(0, "also evaluate every N steps; 0: before and after training only")
    before: bool = setting(True, "evaluate the starting policy before the first step")
    success_reward: float = setting(1.0, "an episode at or above this reward counts as accurate")
    temperature: float = setting(0.0, "forced on every eval request; 0: greedy")
    workflow_kwargs: dict[str, Any] = setting(
        {},
        "the agent's constructor arguments for evaluation, over `workflow_kwargs` (e.g. one "
        'turn, where accuracy is "right on the first try")',
    )

    def __post_init__(self) -> None:
        if self.size < 1 or self.every < 0:
            raise ConfigError(f"eval.size must be >= 1 and eval.every >= 0; got {self}")


@dataclass
class TrackersConfig:
    """Where the run's per-step metrics go besides metrics.jsonl (trainer/trackers.py)."""

    backends: list[str] = setting(
        ["tensorboard"],
        "experiment trackers: any of tensorboard, wandb (offline by default), trackio",
    )
    wandb: dict[str, Any] = setting({}, "wandb.init(**these) options")
    trackio: dict[str, Any] = setting({}, "trackio.init(**these) options")
    tensorboard: dict[str, Any] = setting({}, "TensorBoard options: {log_dir: ...}")

    def __post_init__(self) -> None:
        from trainer.trackers import TRACKERS

        unknown = sorted(set(self.backends) - set(TRACKERS))
        if unknown:
            raise ConfigError(f"trackers.backends: unknown {unknown}; known: {sorted(TRACKERS)}")


@dataclass
class TrainerConfig:
    """A training run: `turnstile train --config run.yaml key.sub=value ...`."""

    experiment_name: str = setting("turnstile", "a label for the run, kept in its config.yaml")
    run_dir: str = setting(
        "runs/turnstile", "where everything goes: config, sessions.db, metrics, checkpoints"
    )
    seed: int = setting(1, "seeds torch and the order of the dataset rows")
    model: str | None = setting(
        None, "a local Hugging Face folder; null: the bundled SmolLM2-135M-Instruct"
    )
    device: str = setting("cpu", "torch device of training (and of the embedded engine)")
    total_steps: int = setting(
        10, "training steps (each: rollouts, then ppo_n_minibatches updates)"
    )
    workflow: str | None = setting(
        None,
        'the agent or RolloutWorkflow class: "module.Class" or "path/file.py:Class" '
        "(trainer/api/workflow.py); `turnstile train --workflow` overrides it",
    )
    workflow_kwargs: dict[str, Any] = setting({}, "the workflow's constructor arguments")
    dataset: dict[str, Any] = setting(
        {},
        "the training rows: {type: jsonl, path: ...} with {messages, answer} rows, or "
        "{type: python, function: file.py:fn, ...} (any function returning rows; datasets.py)",
    )
    rollout: RolloutConfig = setting(RolloutConfig, "episodes per step and how agents run")
    ray: RayConfig = setting(RayConfig, "the Ray cluster of rollout.agent.mode: ray")
    eval: EvalConfig = setting(EvalConfig, "held-out evaluation")
    time_budget_s: float = setting(
        0.0,
        "stop training when the next step (and the final evaluation) would not fit in this "
        "many seconds of wall-clock; 0: no budget",
    )
    min_steps: int = setting(
        0,
        "the time budget never ends training before this many steps: a slow machine runs "
        "longer instead of stopping while a few noisy steps have moved its policy at random "
        "(docs/demo-run.md: runs of 4-7 steps left held-out accuracy to chance); 0: no floor",
    )
    time_estimate: dict[str, float] = setting(
        {},
        "{probe_s, step_s, eval_s} measured on a reference machine, seconds: with them the "
        "run times a short forward+backward here and prints how long it should take",
    )
    gateway: TrainerGatewayConfig = setting(
        TrainerGatewayConfig,
        "the gateway the agents talk to (gateway/config.py, the settings of `turnstile "
        "serve`); `model` and `device` are the trainer's own, `database` defaults to "
        "<run_dir>/sessions.db",
    )
    train: TrainConfig = setting(TrainConfig, "the algorithm and the optimizer")
    save_every: int = setting(
        0, "also write a Hugging Face folder every N steps; 0: only the final one"
    )
    resume: bool = setting(
        False, "continue from the newest checkpoint in run_dir (step, optimizer, data order)"
    )
    checkpoint_every: int = setting(
        0, "DeepSpeed checkpoints for resuming every N steps; 0: only at the end"
    )
    trackers: TrackersConfig = setting(TrackersConfig, "experiment trackers")
    tensorboard: bool = setting(
        True, "false: leave tensorboard out of trackers.backends (kept for older configs)"
    )
    imports: list[str] = setting(
        [],
        "Python files to import first (they may call register_agent, register_env, "
        "register_loss, register_advantage, register_export_style)",
    )
    agent: dict[str, Any] = setting(
        {}, "a registered queue-based agent: {name: ..., args: {...}} (instead of `workflow`)"
    )
    env: dict[str, Any] = setting(
        {}, "the queue-based agent's registered environment: {name: ..., args: {...}}"
    )

    def without_secrets(self) -> dict[str, Any]:
        """The configuration as the run folder and the trackers keep it: no admin or signing key."""
        config = dataclasses.asdict(self)
        return {**config, "gateway": {**config["gateway"], "admin_key": None, "signing_keys": None}}

    def tracker_backends(self) -> list[str]:
        return [b for b in self.trackers.backends if self.tensorboard or b != "tensorboard"]


class ConfigError(ValueError):
    pass


# keys that configs may still carry, and what became of them
REMOVED_KEYS = {"log_every": "was removed: nothing read it (progress shows every step); delete it"}


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    data = _renamed(data, known, where)
    unknown = sorted(set(data) - set(known))
    for key in unknown:
        if (path := f"{where}.{key}".strip(".")) in REMOVED_KEYS:
            raise ConfigError(f"{path} {REMOVED_KEYS[path]}")
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


def _renamed(data: dict[str, Any], known: dict[str, Any], where: str) -> dict[str, Any]:
    """`data` with a field's former name (`setting(old=...)`) read as its name, and a
    warning that says the new one (a FutureWarning: Python shows it to users, where a
    DeprecationWarning from library code is hidden). Both names set: the user's error."""
    out = dict(data)
    for name, f in known.items():
        old = f.metadata.get("old")
        if old is None or old not in out:
            continue
        path, new = f"{where}.{old}".strip("."), f"{where}.{name}".strip(".")
        if name in out:
            raise ConfigError(f"{path} is the old name of {new}: set only {new}")
        warnings.warn(f"{path} is now {new}; the old name is still read", FutureWarning, 2)
        out[name] = out.pop(old)
    return out


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
