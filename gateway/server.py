"""Running the gateway: in the foreground (`turnstile serve`) or on a background thread.

The trainer runs the gateway on its own thread and event loop so that a training step
never stalls an agent's HTTP request, and agents still reach it over real HTTP.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig, reachable_host
from gateway.inference.base import InferenceEngine
from gateway.malloc import limit_arenas
from gateway.state import GatewayState

T = TypeVar("T")


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_allowed(config: GatewayConfig) -> None:
    if not is_loopback(config.host) and not config.admin_key:
        raise SystemExit(
            f"Refusing to listen on {config.host}: set an admin key (TURNSTILE_ADMIN_KEY or "
            "--admin-key) before exposing the gateway beyond this machine."
        )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundGateway:
    """A real uvicorn server on a daemon thread; `url` is ready after `start()`."""

    def __init__(self, config: GatewayConfig, engine: InferenceEngine | None = None) -> None:
        check_bind_allowed(config)
        if config.port == 0:
            config.port = free_port(config.host)
        self.config = config
        self.app = create_app(config, engine)
        self.state: GatewayState = self.app.state.gateway
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host=config.host,
                port=config.port,
                log_level="warning",
                lifespan="on",
                access_log=False,
            )
        )
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the gateway's, once started

    @property
    def url(self) -> str:
        return f"http://{reachable_host(self.config.host)}:{self.config.port}/v1"

    @property
    def engine(self) -> InferenceEngine:
        return self.state.engine

    def start(self, timeout_s: float = 300.0) -> BackgroundGateway:
        def serve() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self._server.serve())
            finally:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()

        self._thread = threading.Thread(target=serve, name="gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("gateway failed to start (see log above)")
            if time.monotonic() > deadline:
                raise TimeoutError("gateway did not start in time")
            time.sleep(0.05)
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run a coroutine on the gateway's loop (where its engine lives) and wait."""
        if self.loop is None:
            raise RuntimeError("the gateway is not running")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> BackgroundGateway:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def serve_forever(config: GatewayConfig, engine: InferenceEngine | None = None) -> None:
    """`turnstile serve`: the gateway as a process of its own."""
    limit_arenas()  # before the threads that would make arenas start
    check_bind_allowed(config)
    app = create_app(config, engine)
    uvicorn.run(app, host=config.host, port=config.port, log_level="info", access_log=False)
