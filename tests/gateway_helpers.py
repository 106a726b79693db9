"""Helpers shared by the gateway tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from gateway.server import BackgroundGateway
from gateway.store.codec import unpack_ints
from gateway.store.database import database_url

ADMIN_KEY = "admin-test"
FAKE_REPLY = "The answer is 4."
HTTP_TIMEOUT = 120.0
# the twelve migrations squashed into one, kept to build stores at their revisions
OLD_CHAIN = Path(__file__).parent / "fixtures" / "migrations_0001_0012"
# the tools the tool-calling tests offer: one with a required argument, one with none
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _no_traceback(response: httpx.Response) -> None:
    """Every body the gateway sends is checked: a stack trace must never leak."""
    response.read()
    assert "Traceback" not in response.text, response.text


def http_client() -> httpx.Client:
    return httpx.Client(timeout=HTTP_TIMEOUT, event_hooks={"response": [_no_traceback]})


def assert_error_shape(response: httpx.Response, status: int | tuple[int, ...]) -> dict[str, Any]:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    assert "Traceback" not in response.text
    return err


def create_session(base_url: str, **body: Any) -> tuple[str, str]:
    """Create a session with the admin key; return (session_id, api_key)."""
    with http_client() as client:
        r = client.post(f"{base_url}/sessions", headers=admin_headers(), json=body)
    assert r.status_code == 201, r.text
    data = r.json()
    return data["id"], data["api_key"]


def openai_client(gateway: BackgroundGateway, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=api_key, max_retries=0, timeout=120)


def read_session(gateway: BackgroundGateway, session_id: str) -> dict[str, Any]:
    with http_client() as client:
        r = client.get(f"{gateway.url}/sessions/{session_id}", headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


def completion_record(gateway: BackgroundGateway, session_id: str, cid: str) -> dict[str, Any]:
    by_id = {c["id"]: c for c in read_session(gateway, session_id)["completions"]}
    assert cid in by_id, f"completion {cid} was not recorded"
    return by_id[cid]


def old_store(database: str, revision: str) -> None:
    """A store built by the old chain of migrations up to `revision`."""
    engine = sa.create_engine(database_url(database))
    cfg = Config()
    cfg.set_main_option("script_location", str(OLD_CHAIN))
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


@contextmanager
def store_connection(database: str) -> Iterator[sa.Connection]:
    """A plain SQLAlchemy connection to a gateway's store (SQLite path or PostgreSQL URL),
    to look at what was really committed, behind the gateway's back."""
    engine = sa.create_engine(database_url(database))
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def recorded(database: str) -> tuple[dict[str, dict], list[tuple[str, str, set[int]]]]:
    """What the gateways sharing one store committed to it: each session's metadata, and
    each completion as (id, session id, the policy versions its tokens carry)."""
    with store_connection(database) as conn:
        sessions = {
            sid: meta if isinstance(meta, dict) else json.loads(meta)
            for sid, meta in conn.execute(sa.text("SELECT id, metadata FROM sessions"))
        }
        rows = conn.execute(sa.text("SELECT id, session_id, output_versions FROM completions"))
        completions = [(cid, sid, set(unpack_ints(blob))) for cid, sid, blob in rows]
    return sessions, completions


async def list_sessions(gw: Any, http: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every session the gateway holds, as the admin's `GET /sessions` lists them."""
    r = await http.get(f"{gw.url}/sessions", headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()["data"]
