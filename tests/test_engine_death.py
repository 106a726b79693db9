"""The engine process dies (SIGKILL) in the middle of generating: a streaming client
gets an error event, a non-streaming one a 503 `engine_unavailable`; nothing is recorded
for them. When the engine comes back on its address, the same gateway serves again.

The engine is tests/fake_sglang_server.py in a process of its own (SGLang's protocol,
one token every 0.1 s), so that it can really be killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gateway_helpers import ADMIN_KEY, HTTP_TIMEOUT, assert_error_shape, bearer, create_session

import gateway.app
from bench.procs import free_port
from gateway.config import GatewayConfig
from gateway.server import BackgroundGateway

TESTS = Path(__file__).resolve().parent
ENGINE = """
import sys
sys.path.insert(0, sys.argv[1])
from fake_sglang_server import FakeSGLangServer
server = FakeSGLangServer(token_delay_s=0.1)
server._server.config.port = int(sys.argv[2])
import asyncio
asyncio.run(server._server.serve())
"""
LONG = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 200}


class EngineProcess:
    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self) -> EngineProcess:
        self.proc = subprocess.Popen([sys.executable, "-c", ENGINE, str(TESTS), str(self.port)])
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and self.proc.poll() is None, "engine did not start"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def engine_and_gateway(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(gateway.app, "load_tokenizer", lambda _dir: tokenizer)
    engine = EngineProcess(free_port()).start()
    config = GatewayConfig(
        port=0,
        database=str(tmp_path / "gw.db"),
        admin_key=ADMIN_KEY,
        engine="sglang",
        engine_urls=[f"http://127.0.0.1:{engine.port}"],
        request_timeout_s=60,
    )
    gw = BackgroundGateway(config).start()
    try:
        yield engine, gw
    finally:
        gw.stop()
        engine.kill()


def _num_completions(http: httpx.Client, gw: BackgroundGateway, session_id: str) -> int:
    r = http.get(f"{gw.url}/sessions/{session_id}", headers=bearer(ADMIN_KEY))
    return len(r.json()["completions"])


@pytest.mark.slow
def test_engine_killed_mid_generation_then_back(engine_and_gateway) -> None:
    engine, gw = engine_and_gateway
    session_id, key = create_session(gw.url)
    with httpx.Client(timeout=HTTP_TIMEOUT) as http:
        # a stream: some tokens arrive, then the engine dies -> an error event, then the end
        events = []
        with http.stream("POST", f"{gw.url}/chat/completions", headers=bearer(key),
                         json={**LONG, "stream": True}) as r:  # fmt: skip
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[6:]))
                if len(events) == 3:
                    engine.kill()
        assert any("choices" in e for e in events[:3])
        errors = [e["error"] for e in events if "error" in e]
        assert errors and errors[-1]["code"] == "engine_unavailable", events[-3:]

        # engine down: a non-streaming request is a 503 at once
        err = assert_error_shape(http.post(f"{gw.url}/chat/completions",
                                           headers=bearer(key), json=LONG), 503)  # fmt: skip
        assert err["code"] == "engine_unavailable"

        # back on its address; a non-streaming request, killed mid-generation: 503
        engine.start()
        pending = http.build_request("POST", f"{gw.url}/chat/completions",
                                     headers=bearer(key), json=LONG)  # fmt: skip
        import threading

        threading.Timer(1.0, engine.kill).start()
        err = assert_error_shape(http.send(pending), 503)
        assert err["code"] == "engine_unavailable"
        assert _num_completions(http, gw, session_id) == 0  # no answer, no record

        # and back again: the same gateway, no restart
        engine.start()
        r = http.post(f"{gw.url}/chat/completions", headers=bearer(key),
                      json={**LONG, "max_tokens": 5})  # fmt: skip
        assert r.status_code == 200, r.text
        assert _num_completions(http, gw, session_id) == 1
