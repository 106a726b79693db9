"""Building the engine a GatewayConfig asks for."""

from __future__ import annotations

from gateway.config import GatewayConfig
from gateway.engines.base import InferenceEngine


def make_engine(config: GatewayConfig) -> InferenceEngine:
    if config.engine == "embedded":
        from gateway.engines.embedded import EmbeddedEngine

        return EmbeddedEngine(
            config.model, device=config.device, max_batch_size=config.max_batch_size
        )
    if config.engine == "fake":
        from gateway.engines.fake import FakeEngine
        from gateway.engines.model_source import load_tokenizer, resolve_model_dir

        tok = load_tokenizer(resolve_model_dir(config.model))
        return FakeEngine(
            tok.encode("The answer is 4.", add_special_tokens=False), int(tok.eos_token_id)
        )
    raise ValueError(f"unknown engine {config.engine!r}: choose 'embedded' or 'fake'")
