"""The FastAPI application: wiring of engine, store, keys and routes."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.api import (
    health_routes,
    openai_routes,
    reward_routes,
    session_routes,
)
from gateway.auth import KeyRing
from gateway.chat_template import ChatRenderer
from gateway.config import GatewayConfig
from gateway.engines.base import InferenceEngine
from gateway.engines.factory import make_engine
from gateway.engines.model_source import load_tokenizer, resolve_model_dir
from gateway.errors import BodySizeLimit, install_error_handlers
from gateway.metrics import Metrics
from gateway.serving_chat import ChatService
from gateway.serving_completions import CompletionService
from gateway.serving_core import ServingCore
from gateway.serving_responses import ResponsesService
from gateway.state import GatewayState
from gateway.store.database import open_database
from gateway.store.recorder import Recorder
from gateway.store.repository import Repository

log = logging.getLogger(__name__)


def build_state(config: GatewayConfig, engine: InferenceEngine | None = None) -> GatewayState:
    """Open the store and tokenizer; the engine is started later, in the lifespan."""
    engine = engine or make_engine(config)
    tokenizer = load_tokenizer(resolve_model_dir(config.model))
    renderer = ChatRenderer(tokenizer)
    db = open_database(config.database)
    repo = Repository(db)
    recorder = Recorder(db)
    metrics = Metrics()
    core = ServingCore(engine, renderer, repo, recorder, metrics, config)
    return GatewayState(
        config,
        engine,
        renderer,
        repo,
        recorder,
        KeyRing(repo, config.admin_key),
        metrics,
        core,
        ChatService(core, renderer, metrics),
        CompletionService(core),
        ResponsesService(core, renderer, metrics),
    )


def create_app(
    config: GatewayConfig | None = None,
    engine: InferenceEngine | None = None,
    state: GatewayState | None = None,
) -> FastAPI:
    config = config or (state.config if state else GatewayConfig())
    state = state or build_state(config, engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.recorder.start()
        await state.engine.start()
        # Hundreds of thousands of long-lived objects (tokenizer, torch, transformers)
        # would otherwise be re-scanned by every full GC, stalling the event loop for
        # ~0.3 s at a time under load (docs/benchmarks.md).
        gc.freeze()
        log.info("gateway ready: engine=%s version=%d", state.engine.name, state.engine.version)
        try:
            yield
        finally:
            await state.engine.close()
            state.recorder.stop()

    app = FastAPI(title="Turnstile gateway", version="0.1.0", lifespan=lifespan)
    app.state.gateway = state
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)
    for module in (openai_routes, session_routes, reward_routes, health_routes):
        app.include_router(module.router)
    return app
