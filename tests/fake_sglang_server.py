"""A stand-in SGLang server for tests: SGLang's native HTTP protocol, deterministic output.

SGLang itself cannot run here (no CPU build of its kernels), so the SGLang engine is
tested against this fake. Field names and shapes are SGLang's own, read from its
server code, v0.5.x (`python/sglang/srt/entrypoints/http_server.py`,
`srt/managers/tokenizer_manager.py` `_handle_batch_output` / `_validate_one_request`
/ `pause_generation` / `update_weights_from_disk`, `srt/managers/io_struct.py`
`GenerateReqInput`, `PauseGenerationReqInput`, `UpdateWeightFromDiskReqInput`) and
the docs at docs.sglang.io (basic_usage/native_api, basic_usage/sampling_params):

- `POST /generate` {input_ids, sampling_params{max_new_tokens, temperature, top_p,
  stop_token_ids, ...}, return_logprob, logprob_start_len, top_logprobs_num, stream}
  -> {"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
  "weight_version", "total_retractions", "completion_tokens", "cached_tokens",
  "input_token_logprobs", "output_token_logprobs": [[logprob, token_id, null], ...],
  "output_top_logprobs"?, "e2e_latency"}}. finish_reason: {"type": "stop", "matched":
  id} | {"type": "length", "length": n} | {"type": "abort", "message": ...}; null in
  stream events before the last. Streaming: `data: {...}\\n\\n` events carrying the
  whole output so far (or only the new part, `incremental=True`, like
  `--incremental-streaming-output`), then `data: [DONE]\\n\\n`.
- Refusals (a ValueError in SGLang): HTTP 400 {"error": {"message"}}; when streaming,
  the same object as an event of a 200 stream.
- `POST /pause_generation` {"mode": "abort"}: aborts what is running (partial output,
  finish_reason abort), holds new requests until `POST /continue_generation`.
- `POST /update_weights_from_disk` {model_path, load_format?, abort_all_requests?,
  weight_version?} -> {"success", "message", "num_paused_requests"} (400 on failure);
  waits for running requests unless paused; holds new ones while it loads.
- `GET /health`, `GET /get_model_info`, `GET /get_server_info`, `GET /v1/models`,
  `POST /flush_cache`.

Tokens depend only on the context (prompt + output so far) and the weights, so a
request resubmitted with its partial output continues exactly as it would have.
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
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

# bench.procs, not gateway.server: run as its own process, this starts in a second,
# without importing the gateway (torch, transformers)
from bench.procs import free_port


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


VOCAB_BASE = 1000  # ordinary word pieces of the SmolLM2 vocabulary
VOCAB_SPAN = 400


def next_token(context: list[int], weights: int) -> int:
    """The fake model: the next token from the context and the weights tag."""
    return VOCAB_BASE + (context[-1] * 31 + len(context) * 7 + weights * 101) % VOCAB_SPAN


def token_logprob(token: int, position: int, weights: int) -> float:
    return -round(0.05 + (token % 13) * 0.01 + (position % 5) * 0.001 + weights * 0.1, 6)


def top_alternatives(token: int, position: int, weights: int, k: int) -> list[list[Any]]:
    """k (logprob, id, text) triples, best first, the sampled token first."""
    lp = token_logprob(token, position, weights)
    alts = [[lp, token, None]]
    for j in range(1, k):
        alts.append([round(lp - j * 0.5, 6), VOCAB_BASE + (token + j) % VOCAB_SPAN, None])
    return alts


class _Req:
    def __init__(self, body: dict[str, Any]) -> None:
        self.rid = uuid.uuid4().hex
        self.input_ids: list[int] = list(body["input_ids"])
        sp = body.get("sampling_params") or {}
        self.max_new_tokens = int(sp.get("max_new_tokens", 128))
        self.stop_ids = set(sp.get("stop_token_ids") or [])
        self.top_k = int(body.get("top_logprobs_num") or 0)
        self.return_logprob = bool(body.get("return_logprob"))
        self.output: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[list[list[Any]]] = []
        self.finish: dict[str, Any] | None = None
        self.aborted = False
        self.created = time.time()


class FakeSGLangServer:
    def __init__(
        self,
        *,
        context_length: int = 4096,
        token_delay_s: float = 0.0,
        eos_id: int = 2,
        stop_after: int | None = None,
        support_pause: bool = True,
        report_weight_version: bool = True,
        incremental: bool = False,
        load_s: float = 0.0,
        model_path: str = "fake/SmolLM2",
        workers: list[str] | None = None,
    ) -> None:
        self.context_length = context_length
        self.token_delay_s = token_delay_s
        self.eos_id = eos_id
        self.stop_after = stop_after  # emit eos after this many tokens (if a stop id)
        self.support_pause = support_pause
        self.report_weight_version = report_weight_version
        self.incremental = incremental
        self.load_s = load_s
        self.model_path = model_path
        self.workers = workers  # answer GET /list_workers like an sglang-router
        self.weights = 0  # bumped by each successful weight load
        self.weight_version = "default"
        self.fail_status: int | None = None  # every /generate and /health answers this
        self.fail_update = False
        self.paused = False
        self.requests: list[tuple[str, Any]] = []  # (path, JSON body), in arrival order
        self.routing_keys: list[str | None] = []  # X-SMG-Routing-Key of each /generate
        self.tokens_made = 0
        self._running: dict[str, _Req] = {}
        # Bound to the server's loop on first use. Closed while paused or loading weights.
        self._open = asyncio.Event()
        self._open.set()
        self._drained = asyncio.Condition()
        self.port = free_port()
        self.app = self._build()
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def generate_bodies(self) -> list[dict[str, Any]]:
        return [b for p, b in self.requests if p == "/generate"]

    def running(self) -> list[_Req]:
        return list(self._running.values())

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> FakeSGLangServer:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve()), name="fake-sglang", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake SGLang server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> FakeSGLangServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # ---- the model -------------------------------------------------------------------
    async def _steps(self, req: _Req) -> AsyncIterator[None]:
        """Decode one token at a time; yield after each, and once more when finished."""
        if not self._open.is_set():  # paused or loading weights: wait (like SGLang)
            await self._open.wait()
        self._running[req.rid] = req
        try:
            while True:
                if req.aborted:
                    req.finish = {"type": "abort", "message": "Abort in running batch"}
                    break
                if len(req.output) >= req.max_new_tokens:
                    req.finish = {"type": "length", "length": req.max_new_tokens}
                    break
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                    if req.aborted:
                        continue
                if self.stop_after is not None and len(req.output) >= self.stop_after:
                    tok = self.eos_id
                else:
                    tok = next_token(req.input_ids + req.output, self.weights)
                pos = len(req.output)
                req.output.append(tok)
                req.logprobs.append(token_logprob(tok, pos, self.weights))
                if req.top_k:
                    req.tops.append(top_alternatives(tok, pos, self.weights, req.top_k))
                self.tokens_made += 1
                if tok in req.stop_ids:
                    req.finish = {"type": "stop", "matched": tok}
                    break
                yield
        finally:
            self._running.pop(req.rid, None)
            async with self._drained:
                self._drained.notify_all()
        yield

    def _output(self, req: _Req, since: int = 0) -> dict[str, Any]:
        """One SGLang output dict: the whole output, or only what is new from `since`."""
        out = req.output[since:]
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finish,
            "prompt_tokens": len(req.input_ids),
        }
        if self.report_weight_version:
            meta["weight_version"] = self.weight_version
        meta["total_retractions"] = 0
        if req.return_logprob:
            meta["input_token_logprobs"] = [[None, req.input_ids[-1], None]] if since == 0 else []
            meta["output_token_logprobs"] = [
                [lp, tok, None] for lp, tok in zip(req.logprobs[since:], out, strict=True)
            ]
            if req.top_k:
                meta["input_top_logprobs"] = [None] if since == 0 else []
                meta["output_top_logprobs"] = req.tops[since:]
        meta["completion_tokens"] = len(req.output)
        meta["cached_tokens"] = 0
        if req.finish is not None:
            meta["e2e_latency"] = time.time() - req.created
        return {"text": "".join(f"<{t}>" for t in out), "output_ids": out, "meta_info": meta}

    def _refusal(self, body: dict[str, Any]) -> str | None:
        """SGLang's own checks and messages (tokenizer_manager._validate_one_request)."""
        ids = body.get("input_ids")
        if not ids:
            return "Either text, input_ids or input_embeds should be provided."
        n = len(ids)
        if n >= self.context_length:
            return (
                f"The input ({n} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        m = (body.get("sampling_params") or {}).get("max_new_tokens")
        if m is not None and m + n >= self.context_length:
            return (
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens. You requested a total of {m + n} tokens: "
                f"{n} tokens from the input messages and {m} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )
        return None

    async def _abort_all_and_drain(self) -> None:
        for req in self._running.values():
            req.aborted = True
        async with self._drained:
            await self._drained.wait_for(lambda: not self._running)

    # ---- HTTP ------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        app = FastAPI()

        async def body_of(request: Request, path: str) -> dict[str, Any]:
            raw = await request.body()
            body = json.loads(raw) if raw else {}
            self.requests.append((path, body))
            return body

        @app.api_route("/generate", methods=["POST", "PUT"])
        async def generate(request: Request) -> Response:
            body = await body_of(request, "/generate")
            self.routing_keys.append(request.headers.get("x-smg-routing-key"))
            if self.fail_status is not None:
                return PlainTextResponse("Internal Server Error", status_code=self.fail_status)
            refusal = self._refusal(body)
            if not body.get("stream"):
                if refusal:
                    return JSONResponse({"error": {"message": refusal}}, status_code=400)
                req = _Req(body)
                async for _ in self._steps(req):
                    pass
                return Response(_dumps(self._output(req)), media_type="application/json")

            async def events() -> AsyncIterator[bytes]:
                if refusal:
                    yield b"data: " + _dumps({"error": {"message": refusal}}) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    return
                req = _Req(body)
                sent = 0
                async for _ in self._steps(req):
                    if len(req.output) == sent and req.finish is None:
                        continue
                    since = sent if self.incremental else 0
                    yield b"data: " + _dumps(self._output(req, since)) + b"\n\n"
                    sent = len(req.output)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        @app.get("/health")
        @app.get("/health_generate")
        async def health() -> Response:
            self.requests.append(("/health", None))
            return Response(status_code=503 if self.fail_status else 200)

        @app.get("/get_model_info")
        async def get_model_info() -> dict[str, Any]:
            return {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
            }

        @app.get("/get_server_info")
        async def get_server_info() -> dict[str, Any]:
            return {
                "model_path": self.model_path,
                "context_length": None,  # ServerArgs: only set with --context-length
                "max_total_num_tokens": 100_000,
                "max_req_input_len": self.context_length - 1,
                "internal_states": [{}],
                "version": "0.5.x-fake",
            }

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            card = {
                "id": self.model_path,
                "object": "model",
                "created": 0,
                "owned_by": "sglang",
                "root": self.model_path,
                "max_model_len": self.context_length,
            }
            return {"object": "list", "data": [card]}

        if self.workers is not None:

            @app.get("/list_workers")
            async def list_workers() -> dict[str, Any]:
                return {"urls": self.workers}

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache() -> Response:
            return PlainTextResponse("Cache flushed.\n")

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request) -> Response:
            body = await body_of(request, "/update_weights_from_disk")
            if body.get("abort_all_requests"):
                for req in self._running.values():
                    req.aborted = True
            if not self.paused:  # the writer lock: wait for running requests, hold new ones
                self._open.clear()
                async with self._drained:
                    await self._drained.wait_for(lambda: not self._running)
            try:
                if self.load_s:
                    await asyncio.sleep(self.load_s)
                if self.fail_update or not body.get("model_path"):
                    content = {
                        "success": False,
                        "message": f"Failed to get weights iterator: {body.get('model_path')}",
                        "num_paused_requests": 0,
                    }
                    return JSONResponse(content, status_code=400)
                self.weights += 1
                self.model_path = body["model_path"]
                message = "Succeeded to update model weights."
                if body.get("weight_version") is not None:
                    self.weight_version = str(body["weight_version"])
                    message += f" Weight version updated to {self.weight_version}."
                return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})
            finally:
                if not self.paused:
                    self._open.set()

        if self.support_pause:

            @app.post("/pause_generation")
            async def pause_generation(request: Request) -> Response:
                body = await body_of(request, "/pause_generation")
                if body.get("mode", "abort") not in ("abort", "retract", "in_place"):
                    return JSONResponse({"error": {"message": "Invalid mode"}}, status_code=400)
                self.paused = True
                self._open.clear()
                await self._abort_all_and_drain()
                return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

            @app.post("/continue_generation")
            async def continue_generation(request: Request) -> Response:
                await body_of(request, "/continue_generation")
                self.paused = False
                self._open.set()
                return JSONResponse(
                    {"message": "Generation continued successfully.", "status": "ok"}
                )

        return app
