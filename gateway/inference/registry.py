"""Inference engines by name: one table feeds the factory, the CLI and the trainer.

Adding an engine is one module plus one `@register_inference_engine` builder here.
`weights` says how the trainer hands it new weights by default: "memory" (a state
dict, for an engine in the trainer's own process), "push" (broadcast from trainer rank 0
into the servers' workers, no disk: weight_receiver.py) or "disk" (a Hugging Face folder
it loads; any engine's fallback when `gateway.weight_sync: disk` names it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gateway.config import GatewayConfig
from gateway.inference.base import InferenceEngine
from gateway.registry import Registry

if TYPE_CHECKING:
    from gateway.inference.remote import ServerOptions

Builder = Callable[[GatewayConfig], InferenceEngine]


@dataclass(frozen=True)
class EngineSpec:
    name: str
    build: Builder
    weights: Literal["memory", "push", "disk"]
    trainable: bool  # can the trainer push new weights to it
    help: str


INFERENCE_ENGINES: Registry[EngineSpec] = Registry("engine")
engine_spec = INFERENCE_ENGINES.lookup


def register_inference_engine(
    name: str,
    *,
    weights: Literal["memory", "push", "disk"],
    trainable: bool = True,
    help: str = "",
) -> Callable[[Builder], Builder]:
    def register(build: Builder) -> Builder:
        INFERENCE_ENGINES.add(name, EngineSpec(name, build, weights, trainable, help))
        return build

    return register


def make_inference_engine(config: GatewayConfig) -> InferenceEngine:
    return engine_spec(config.engine).build(config)


@register_inference_engine("embedded", weights="memory", help="in-process Hugging Face model")
def _embedded(config: GatewayConfig) -> InferenceEngine:
    from gateway.inference.embedded import EmbeddedEngine

    return EmbeddedEngine(config.model, device=config.device, max_batch_size=config.max_batch_size)


@register_inference_engine("sglang", weights="disk", help="SGLang servers or sglang-router")
def _sglang(config: GatewayConfig) -> InferenceEngine:
    from gateway.inference.sglang import SGLangEngine

    return SGLangEngine(config.engine_urls, _server_options(config, "SGLANG_API_KEY"))


@register_inference_engine("vllm", weights="push", help="vLLM servers (token-in/token-out API)")
def _vllm(config: GatewayConfig) -> InferenceEngine:
    from gateway.inference.vllm import VLLMEngine

    return VLLMEngine(config.engine_urls, _server_options(config, "VLLM_API_KEY"))


def _server_options(config: GatewayConfig, api_key_env: str) -> ServerOptions:
    """What the gateway's config (and the servers' API key, from the environment) says
    about talking to external inference servers."""
    from gateway.inference.remote import ServerOptions

    return ServerOptions(
        update_urls=tuple(config.engine_update_urls),
        fallback_max_context=config.engine_max_context,
        timeout_s=config.request_timeout_s,
        api_key=os.environ.get(api_key_env) or None,
    )


@register_inference_engine(
    "fake", weights="disk", trainable=False, help="instant fixed answers (tests, benchmarks)"
)
def _fake(config: GatewayConfig) -> InferenceEngine:
    from gateway.chat.tokenizer import load_tokenizer
    from gateway.inference.fake import FakeEngine
    from gateway.inference.model_source import resolve_model_dir

    tok = load_tokenizer(resolve_model_dir(config.model))
    return FakeEngine(
        tok.encode("The answer is 4.", add_special_tokens=False),
        int(tok.eos_token_id),
        delay_s=config.fake_delay_s,
    )
