"""The user-facing contracts, and the one import surface for user code.

    from trainer.api import RolloutWorkflow, LLMRequest, register_loss, TrainConfig

The contracts themselves live in this package, one module each:

- `workflow.py`: an agent (`AgentWorkflow`: `async def run(self, data, **extra_kwargs)`)
  and a token-level `RolloutWorkflow` (`arun_episode(engine, data)`);
- `agent.py`: the queue-based `Agent` (`collect_trajectory`), its `EnvironmentService`
  and the `BundledGenerationOutputs` it is sent;
- `io_struct.py`: `LLMRequest`, `LLMResponse`, `GenerationHyperparameters`;
- `train_engine.py`: `TrainEngine.train_batch(data, loss_fn, loss_weight_fn)`;
- `registry.py`: `register_loss`, `register_advantage`, `register_export_style`,
  `register_agent`, `register_env`;
- `config.py`: the YAML config's dataclasses (every field with its help) and `load_config`.

The names below (those and the implementations a user's code calls or subclasses)
resolve on first use, so an agent that needs only `import_file` (say, in a
`mode: subproc` worker) does not pay for importing torch and DeepSpeed.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    # running training
    "Trainer": "trainer.trainer",
    "import_file": "trainer.loading",
    "load_dataset": "trainer.datasets",
    # configs
    "AgentConfig": "trainer.api.config",
    "ConfigError": "trainer.api.config",
    "EvalConfig": "trainer.api.config",
    "GatewayConfig": "trainer.api.config",
    "RayConfig": "trainer.api.config",
    "RolloutConfig": "trainer.api.config",
    "TrackersConfig": "trainer.api.config",
    "TrainConfig": "trainer.api.config",
    "TrainerConfig": "trainer.api.config",
    "load_config": "trainer.api.config",
    # agents and token-level workflows
    "AgentWorkflow": "trainer.api.workflow",
    "RolloutWorkflow": "trainer.api.workflow",
    "RolloutEngine": "trainer.rollout.engine",
    "GenerationHyperparameters": "trainer.api.io_struct",
    "LLMRequest": "trainer.api.io_struct",
    "LLMResponse": "trainer.api.io_struct",
    # queue-based agents
    "Agent": "trainer.api.agent",
    "BundledGenerationOutputs": "trainer.api.agent",
    "EnvironmentService": "trainer.api.agent",
    # registration by name
    "register_advantage": "trainer.api.registry",
    "register_agent": "trainer.api.registry",
    "register_env": "trainer.api.registry",
    "register_export_style": "trainer.api.registry",
    "register_loss": "trainer.api.registry",
    # training algorithms
    "LossFn": "trainer.api.train_engine",
    "LossWeightFn": "trainer.api.train_engine",
    "TrainEngine": "trainer.api.train_engine",
    "DeepSpeedEngine": "trainer.backend.deepspeed_engine",
    "gather_logprobs": "trainer.backend.functional",
    "next_token_logprobs": "trainer.backend.functional",
    "predicting_positions": "trainer.backend.functional",
    # the gateway's pieces a token-level agent renders and tokenizes with
    "ChatRenderer": "gateway.chat.template",
    "load_tokenizer": "gateway.inference.model_source",
    "resolve_model_dir": "gateway.inference.model_source",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"trainer.api has no {name!r}; it offers {__all__}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
