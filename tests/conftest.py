"""Shared fixtures: real gateways on real sockets, with a fake or the real embedded engine."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
# Load the model from the cached safetensors copy (the first resolve converts the GGUF).
os.environ.setdefault("TURNSTILE_CACHE", str(REPO / ".cache"))

from gateway_helpers import ADMIN_KEY, FAKE_REPLY, create_session, http_client  # noqa: E402

import gateway.app  # noqa: E402
from bench.postgres import PostgresServer  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402
from gateway.inference.fake import FakeEngine  # noqa: E402
from gateway.inference.model_source import load_tokenizer, resolve_model_dir  # noqa: E402
from gateway.server import BackgroundGateway  # noqa: E402

STORE_BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked `both_stores` that use a store run once on SQLite, once on PostgreSQL."""
    if "store_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "both_stores"
    ):
        metafunc.parametrize("store_backend", STORE_BACKENDS, indirect=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the whole run (started on first use).

    fsync is off: these tests kill gateways, not the machine.
    """
    with PostgresServer(fsync=False) as server:
        yield server


@pytest.fixture
def store_backend(request: pytest.FixtureRequest) -> str:
    """`sqlite` unless the test is marked `both_stores` (then both, in turn)."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def new_database(
    store_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[[], str]:
    """`new_database()`: a new, empty store of this test's backend (a path or a URL)."""
    count = iter(range(1_000_000))

    def make() -> str:
        if store_backend == "postgresql":
            return request.getfixturevalue("postgres").create_database()
        return str(tmp_path / f"t{next(count)}.db")

    return make


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(resolve_model_dir(None))


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with http_client() as client:
        yield client


@pytest.fixture
def new_session() -> Callable[..., tuple[str, str]]:
    """`new_session(gateway_or_url, **body) -> (session_id, api_key)`."""

    def make(gateway: BackgroundGateway | str, **body: Any) -> tuple[str, str]:
        url = gateway if isinstance(gateway, str) else gateway.url
        return create_session(url, **body)

    return make


@pytest.fixture
def gateway_factory(
    new_database, tokenizer, monkeypatch
) -> Iterator[Callable[..., BackgroundGateway]]:
    """Start gateways backed by a FakeEngine that answers FAKE_REPLY in real token ids.

    `engine.script("text", ...)` makes it answer the next requests with those texts.
    """
    # Reuse the session's tokenizer: reloading it is most of a gateway's start-up time.
    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
    started: list[BackgroundGateway] = []

    def make(config: dict[str, Any] | None = None, **engine_kwargs: Any) -> BackgroundGateway:
        """`config`: GatewayConfig fields to override; the rest go to FakeEngine."""
        engine_kwargs.setdefault(
            "reply_ids", tokenizer.encode(FAKE_REPLY, add_special_tokens=False)
        )
        engine_kwargs.setdefault("stop_id", int(tokenizer.eos_token_id))
        engine_kwargs.setdefault(
            "encode", lambda text: tokenizer.encode(text, add_special_tokens=False)
        )
        engine = FakeEngine(**engine_kwargs)
        config = GatewayConfig(
            **{
                "port": 0,
                "database": new_database(),
                "admin_key": ADMIN_KEY,
                "engine": "fake",
                **(config or {}),  # e.g. one `database` for several replicas
            }
        )
        gw = BackgroundGateway(config, engine=engine).start()
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()


@pytest.fixture
def fake_gateway(gateway_factory) -> BackgroundGateway:
    """A running gateway (function scope: ~0.3 s to start) with an instant fake engine."""
    return gateway_factory()


@pytest.fixture(scope="module")
def embedded_gateway(tmp_path_factory) -> Iterator[BackgroundGateway]:
    """A running gateway with the real in-process SmolLM2 engine, shared by a module."""
    db = tmp_path_factory.mktemp("embedded") / "e.db"
    config = GatewayConfig(port=0, database=str(db), admin_key=ADMIN_KEY, engine="embedded")
    with BackgroundGateway(config, engine=None) as gw:
        yield gw
