"""Building the engine a GatewayConfig asks for."""

from __future__ import annotations

import os

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
    if config.engine == "sglang":
        from gateway.engines.sglang import SGLangEngine

        if not config.engine_urls:
            raise ValueError(
                "the sglang engine needs the URL of an SGLang server or sglang-router "
                "(--engine-url http://host:30000, or gateway.engine_urls in the config)"
            )
        return SGLangEngine(
            config.engine_urls,
            update_urls=config.engine_update_urls or None,
            fallback_max_context=config.engine_max_context,
            timeout_s=config.request_timeout_s,
            api_key=os.environ.get("SGLANG_API_KEY") or None,
        )
    raise ValueError(f"unknown engine {config.engine!r}: choose 'embedded', 'sglang' or 'fake'")
