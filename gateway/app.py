"""The FastAPI application: wiring of engine, store, keys and routes."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway import ui
from gateway.api_schema import install_openapi
from gateway.auth import KeyRing
from gateway.auth_limits import AuthLimiter
from gateway.chat.template import ChatRenderer, load_chat_template
from gateway.chat.tokenizer import load_tokenizer
from gateway.config import GatewayConfig
from gateway.entrypoints import health, rewards, sessions, weights
from gateway.entrypoints.anthropic.messages import api_router as messages
from gateway.entrypoints.hot_routes import GeneratingRoutes
from gateway.entrypoints.incremental_body import IncrementalBodies
from gateway.entrypoints.openai import models
from gateway.entrypoints.openai.chat_completion import api_router as chat_completion
from gateway.entrypoints.openai.completion import api_router as completion
from gateway.entrypoints.openai.responses import api_router as responses
from gateway.errors import install_error_handlers
from gateway.inference.base import InferenceEngine
from gateway.inference.model_source import resolve_model_dir
from gateway.inference.registry import make_inference_engine
from gateway.metrics import Metrics
from gateway.serving.endpoint import Stages
from gateway.serving.generate import Generator
from gateway.serving.prompt import Prompts
from gateway.serving.quotas import Admission
from gateway.serving.record import Records
from gateway.signing import Signer
from gateway.state import GatewayState
from gateway.store.database import open_database
from gateway.store.recorder import Recorder
from gateway.store.repository import Repository

# Every route of the gateway; a new endpoint is one folder plus one line here.
ROUTERS = (
    chat_completion, completion, responses, messages, models, sessions, rewards, health, weights, ui
)  # fmt: skip

log = logging.getLogger(__name__)


def build_state(config: GatewayConfig, engine: InferenceEngine | None = None) -> GatewayState:
    """Open the store and tokenizer; the engine is started later, in the lifespan."""
    engine = engine or make_inference_engine(config)
    tokenizer = load_tokenizer(resolve_model_dir(config.model))
    template = load_chat_template(config.chat_template) if config.chat_template else None
    renderer = ChatRenderer(
        tokenizer,
        template,
        word_cache_size=config.word_cache_size,
        history_cache_size=config.history_cache_size,
    )
    db = open_database(config.database or "turnstile.db")
    repo = Repository(db)
    metrics = Metrics()
    recorder = Recorder(db, on_commit=metrics.store_commit_seconds.observe)
    generator = Generator(engine, renderer, metrics, config)
    stages = Stages(
        Prompts(renderer, repo, metrics, config, generator.tool_parser_name),
        generator,
        Records(repo, recorder, metrics, config.request_timeout_s),
        Admission(repo, metrics, config.max_pending_requests),
        Signer(repo, config.signing_keys, config.signing_key_grace_s),
        config,
    )
    limiter = AuthLimiter(
        config.auth_failure_limit, config.auth_failure_window_s, config.auth_lockout_s
    )
    keys = KeyRing(repo, config.admin_key, cache_size=config.key_cache_size, limiter=limiter)
    bodies = IncrementalBodies(config.parent_cache_size, config.body_cache_mb * 2**20)
    return GatewayState(config, engine, renderer, repo, recorder, keys, metrics, stages, bodies)


def create_app(
    config: GatewayConfig | None = None, engine: InferenceEngine | None = None
) -> FastAPI:
    config = config or GatewayConfig()
    state = build_state(config, engine)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.recorder.start()
        await state.engine.start()
        # Hundreds of thousands of long-lived objects (tokenizer, torch, transformers)
        # would otherwise be re-scanned by every full GC, stalling the event loop for
        # ~0.3 s at a time under load (docs/benchmarks.md). Garbage is collected first:
        # a frozen cycle is never freed.
        gc.collect()
        gc.freeze()
        # A collection of the young generation every 10,000 new containers, not 700:
        # each turn of a long session makes a few thousand (its parsed messages) and
        # keeps a 40k-id prompt, which every collection that sees it walks id by id.
        # Collections cost ~1 ms a request at turn 64 with the default, ~0.2 with this.
        gc.set_threshold(10_000, 10, 10)
        poll = asyncio.get_running_loop().create_task(state.keys.poll_ended())
        log.info("gateway ready: engine=%s version=%d", state.engine.name, state.engine.version)
        try:
            yield
        finally:
            poll.cancel()
            await state.engine.close()
            state.recorder.stop()
            state.repo.db.dispose()  # give a shared PostgreSQL its connections back
            # what this gateway held (its model, in an embedded engine) may be freed once
            # it is unreferenced: a process that starts another gateway (the trainer's
            # evaluations, tests) would otherwise keep every stopped one's cycles
            gc.unfreeze()

    # FastAPI's OpenTelemetry instrumentation off: the gateway's metrics are Prometheus
    # (gateway/metrics.py), and its check for global providers ran on every request.
    app = FastAPI(
        title="Turnstile gateway",
        version="0.1.0",
        lifespan=lifespan,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.gateway = state
    # innermost: the generating POSTs, answered before the router (hot_routes.py)
    app.add_middleware(GeneratingRoutes, routers=[m.router for m in ROUTERS])
    # outermost: the body-size limit, the unexpected-error catcher and the request timer
    install_error_handlers(app, config.max_body_bytes, state.metrics.observe_request)
    for module in ROUTERS:
        app.include_router(module.router)
    install_openapi(app)
    return app
