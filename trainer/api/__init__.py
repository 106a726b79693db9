"""The one import surface for user code: agents, workflows, environments and losses.

    from trainer.api import RolloutWorkflow, LLMRequest, register_loss, import_file

Names resolve on first use, so an agent that needs only `import_file` (say, in a
`mode: subproc` worker) does not pay for importing torch and DeepSpeed.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    # running training
    "Trainer": "trainer.trainer",
    "TrainerConfig": "trainer.config",
    "TrainConfig": "trainer.config",
    "load_config": "trainer.config",
    "import_file": "trainer.loading",
    "load_dataset": "trainer.datasets",
    # token-level workflows
    "RolloutWorkflow": "trainer.rollout.workflow",
    "RolloutEngine": "trainer.rollout.engine",
    "GenerationHyperparameters": "trainer.rollout.llm_api",
    "LLMRequest": "trainer.rollout.llm_api",
    "LLMResponse": "trainer.rollout.llm_api",
    # queue-based agents
    "Agent": "trainer.rollout.agent_env",
    "EnvironmentService": "trainer.rollout.agent_env",
    "BundledGenerationOutputs": "trainer.rollout.queue_agents",
    "register_agent": "trainer.rollout.registry",
    "register_env": "trainer.rollout.registry",
    # algorithms
    "register_loss": "trainer.algorithm.losses",
    "register_advantage": "trainer.algorithm.advantages",
    "TrainEngine": "trainer.backend.train_engine",
    "DeepSpeedEngine": "trainer.backend.deepspeed_engine",
    "gather_logprobs": "trainer.backend.functional",
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
