"""Gateway settings (CLI flags and the trainer's YAML both end up here)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (`turnstile serve` defaults to 8000)
    # a file path (SQLite) or a SQLAlchemy URL; None: turnstile.db here (serve) or
    # <run_dir>/sessions.db (training)
    database: str | None = None
    admin_key: str | None = field(
        default_factory=lambda: os.environ.get("TURNSTILE_ADMIN_KEY") or None
    )
    engine: str = "embedded"  # embedded | sglang | fake
    # None = bundled SmolLM2-135M-Instruct; or a local HF folder. With sglang, the
    # tokenizer and chat template (the gateway renders prompts itself): the same model
    # the SGLang servers serve.
    model: str | None = None
    # sglang: one URL (a server, or an sglang-router) or several (sticky per session)
    engine_urls: list[str] = field(default_factory=list)
    # sglang: the servers weight updates go to; default: each engine URL, or the
    # workers an sglang-router lists
    engine_update_urls: list[str] = field(default_factory=list)
    # sglang: context length to assume when the servers do not report theirs
    engine_max_context: int = 4096
    served_model_name: str = "default"
    device: str = "cpu"
    max_batch_size: int = 32
    default_max_tokens: int = 512
    session_ttl_s: float = 24 * 3600
    request_timeout_s: float = 600.0  # longest an engine may take for one answer -> 503
    max_body_bytes: int = 16 * 1024 * 1024  # larger request bodies -> 413
    max_pending_requests: int = 1024  # choices generating at once; more -> 429
    max_n: int = 16  # largest `n` (choices per request); more -> 422
    # tool-call format to parse (gateway/chat/tool_parsers): "auto" = from the template
    tool_parser: str = "auto"
