"""HTTP client of one or more SGLang servers (SGLang's native API, not its OpenAI API).

The gateway renders the chat template itself, so SGLang only ever sees token ids:
`POST /generate` with `input_ids` and `return_logprob`, and the answer's
`meta_info.output_token_logprobs` ([logprob, token_id, text] per output token) gives
exactly the ids and behaviour-policy logprobs the trainer learns from.

Protocol, as read from SGLang's own server code (`srt/entrypoints/http_server.py`,
`srt/managers/tokenizer_manager.py`, `srt/managers/io_struct.py`, v0.4.9 - v0.5.x):
- `/generate` answers `{"text", "output_ids", "meta_info": {"id", "finish_reason",
  "prompt_tokens", "completion_tokens", "output_token_logprobs", "weight_version"?, ...}}`;
  `finish_reason` is None while streaming, then `{"type": "stop"|"length"|"abort", ...}`.
  Streaming sends `data: {...}` lines, cumulative by default (incremental with
  `--incremental-streaming-output`; both are handled), then `data: [DONE]`. A refused
  request is HTTP 400 `{"error": {"message"}}`, or that object as a stream event.
- `/pause_generation` (v0.4.9.post2+, `{"mode": "abort"}` from v0.5.5) aborts the
  requests in flight (they come back with `finish_reason.type == "abort"` and their
  partial output) and holds new ones until `/continue_generation`.
- `/update_weights_from_disk` `{"model_path", "abort_all_requests", "weight_version"}`
  -> `{"success", "message", "num_paused_requests"}` (400 when not successful).

Weight updates keep per-token versions exact the way AReaL's RemoteSGLangEngine does:
new requests wait while an update runs; the servers are paused (which aborts what
they are generating), loaded, then resumed; an aborted request is resubmitted with
its prompt plus the tokens it already has, for the tokens still to come. Tokens made
before the update carry the old version, tokens after it the new one.

Several servers: `StickyRouter` keeps each session (`route_key`) on one server. With
one URL (a server, or an `sglang-router` in front of several) it is used as is; the
session id also travels as the `X-SMG-Routing-Key` header, which sglang-router's
`manual` and `consistent_hashing` policies pin sessions by.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.inference.base import (
    EngineError,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    TokenChunk,
    TopLogprobs,
)
from gateway.inference.http_client import ConnectFailed, EngineHTTP, HTTPFailed, TimedOut
from gateway.inference.routing import StickyRouter
from gateway.inference.sglang_protocol import (
    as_int,
    dumps,
    error_message,
    finish_reason,
    generate_body,
    new_tokens,
    normalize_url,
    parse_output,
    raise_if_refused,
    refusal,
)

log = logging.getLogger(__name__)

ROUTING_HEADER = "X-SMG-Routing-Key"  # what sglang-router's sticky policies read


class ServerUnreachable(EngineError):
    """No connection could be made: the request never reached the server."""

    def __init__(self, url: str, exc: BaseException) -> None:
        super().__init__(
            f"cannot reach the SGLang server at {url}: {str(exc) or type(exc).__name__}"
        )
        self.url = url


@dataclass(slots=True)
class _Segment:
    """What one /generate call (one segment of a possibly resubmitted request) returned."""

    ids: list[int] = field(default_factory=list)
    finish: dict[str, Any] | None = None


class SGLangEngine(InferenceEngine):
    name = "sglang"

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        update_urls: Sequence[str] | None = None,
        max_context: int | None = None,
        fallback_max_context: int = 4096,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        health_timeout_s: float = 30.0,
        update_timeout_s: float = 1800.0,
        max_connections: int = 1024,
        max_route_keys: int = 100_000,
        max_resubmits: int = 16,
        send_seed: bool = True,
        routing_header: str | None = ROUTING_HEADER,
        api_key: str | None = None,
    ) -> None:
        """
        urls: SGLang servers, or one sglang-router. Several: sticky per route key.
        update_urls: where weight updates go; default: the servers behind each URL
            (an sglang-router is asked for its workers with `GET /list_workers`).
        max_context: override; default: asked from the server at start().
        fallback_max_context: when the server cannot tell (or is down at start).
        send_seed: send `sampling_seed` (SGLang >= 0.5.3; older servers refuse it).
        api_key: the servers' `--api-key`, sent as a bearer token.
        """
        url_list = [urls] if isinstance(urls, str) else list(urls)
        if not url_list:
            raise ValueError("the sglang engine needs at least one server URL (--engine-url)")
        self.urls = [normalize_url(u) for u in url_list]
        self.update_urls = [normalize_url(u) for u in update_urls] if update_urls else None
        self.router = (
            StickyRouter(self.urls, max_keys=max_route_keys) if len(self.urls) > 1 else None
        )
        self._max_context_override = max_context
        self.fallback_max_context = fallback_max_context
        self._server_context: int | None = None
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.health_timeout_s = health_timeout_s
        self.update_timeout_s = update_timeout_s
        self.max_connections = max_connections
        self.max_resubmits = max_resubmits
        self.send_seed = send_seed
        self.routing_header = routing_header
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client: EngineHTTP | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._version = 0
        # Weight updates: new segments wait on the gate; `_started`/`_done` count updates.
        self._gate: asyncio.Event | None = None
        self._update_lock: asyncio.Lock | None = None
        self._updates_started = 0
        self._updates_done = 0
        self._info_task: asyncio.Task[None] | None = None
        self._info_next_try = 0.0
        self.pause_supported: dict[str, bool] = {}  # learnt at the first update
        self.resubmits = 0  # segments sent again after an abort (weight updates)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        if self._client is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._gate = asyncio.Event()
        self._gate.set()
        self._update_lock = asyncio.Lock()
        self._client = EngineHTTP(
            headers=self._headers,
            timeout_s=self.timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            max_connections=self.max_connections,
        )
        await self._client.start()
        if not await self._fetch_info():
            log.warning(
                "no SGLang server answered at %s; serving anyway (max context %d until one does)",
                ", ".join(self.urls),
                self.max_context,
            )

    async def close(self) -> None:
        if self._info_task is not None:
            self._info_task.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        if self._max_context_override:
            return self._max_context_override
        if self._server_context:
            # SGLang refuses input + max_new_tokens >= its context length.
            return self._server_context - 1
        return self.fallback_max_context

    async def health(self) -> bool:
        if self._client is None:
            return False
        ok = await asyncio.gather(*(self._healthy(u) for u in self.urls))
        if self.router is not None:
            for url, up in zip(self.urls, ok, strict=True):
                (self.router.mark_up if up else self.router.mark_down)(url)
        if any(ok) and self._server_context is None and self._max_context_override is None:
            await self._fetch_info()
        return any(ok)

    async def _healthy(self, url: str) -> bool:
        assert self._client is not None
        try:
            r = await self._client.get(f"{url}/health", timeout=self.health_timeout_s)
        except HTTPFailed:
            return False
        return r.status == 200

    async def _fetch_info(self) -> bool:
        """Learn the context length and weight version; True if a server answered."""
        contexts: list[int] = []
        answered = False
        for url in self.urls:
            ctx, version, ok = await self._server_info(url)
            answered = answered or ok
            if ctx:
                contexts.append(ctx)
            if version is not None and version > self._version:
                self._version = version
        if contexts:
            self._server_context = min(contexts)
        return answered

    async def _server_info(self, url: str) -> tuple[int | None, int | None, bool]:
        """(context length, weight version as an int, answered) for one server."""
        ctx: int | None = None
        version: int | None = None
        answered = False
        for path in ("/get_model_info", "/v1/models", "/get_server_info"):
            data = await self._get_json(url, path)
            if data is None:
                continue
            answered = True
            if path == "/get_model_info":
                version = as_int(data.get("weight_version"))
            elif path == "/v1/models":
                models = data.get("data") or []
                ctx = as_int(models[0].get("max_model_len")) if models else None
            elif ctx is None:
                ctx = as_int(data.get("context_length"))
                max_input = as_int(data.get("max_req_input_len"))
                if ctx is None and max_input is not None:
                    ctx = max_input + 1
            if ctx is not None and path != "/get_model_info":
                break
        return ctx, version, answered

    async def _get_json(self, url: str, path: str) -> Any:
        assert self._client is not None
        try:
            r = await self._client.get(f"{url}{path}", timeout=self.connect_timeout_s + 10)
        except HTTPFailed:
            return None
        if r.status != 200:
            return None
        try:
            return json.loads(r.content)
        except ValueError:
            return None

    # ---- generation ------------------------------------------------------------------
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> GenerationResult:
        result: GenerationResult | None = None
        async for item in self._run(prompt_ids, params, route_key, stream=False):
            if isinstance(item, GenerationResult):
                result = item
        assert result is not None
        return result

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        async for item in self._run(prompt_ids, params, route_key, stream=True):
            yield item

    async def _run(
        self, prompt_ids: list[int], params: SamplingParams, route_key: str | None, stream: bool
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        if self._client is None or self._gate is None:
            raise EngineError("the sglang engine is not started")
        if not prompt_ids:
            raise ValueError("prompt must contain at least one token")
        if (
            self._server_context is None
            and self._max_context_override is None
            and self._info_task is None
            and time.monotonic() >= self._info_next_try
        ):  # the servers were down at start(): learn their context length once they answer
            self._info_next_try = time.monotonic() + 30.0
            self._info_task = asyncio.create_task(self._fetch_info_later())
        output: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        top: list[TopLogprobs] | None = [] if params.top_logprobs else None
        submitted = time.perf_counter()
        first_token: float | None = None
        url = self._pick(route_key)
        tried: set[str] = set()
        stalled = 0  # consecutive aborted segments that made no progress
        finish: dict[str, Any] = {"type": "length"}
        try:
            while len(output) < params.max_new_tokens:
                if not self._gate.is_set():
                    await self._gate.wait()
                version_before, update_epoch = self._version, self._updates_started
                body = self._body(prompt_ids + output, params, len(output), stream)
                headers = (
                    {self.routing_header: route_key} if route_key and self.routing_header else None
                )
                seg = _Segment()
                segment_version: int | None = None
                try:
                    async for ids, lps, alts, weight_version in self._segment(
                        url, body, headers, stream, seg, len(prompt_ids)
                    ):
                        if weight_version is not None:
                            v = weight_version
                            self._version = max(self._version, v)
                        else:
                            if segment_version is None:
                                segment_version = self._stamp(version_before, update_epoch, seg)
                            v = segment_version
                        if first_token is None:
                            first_token = time.perf_counter()
                        output += ids
                        logprobs += lps
                        versions += [v] * len(ids)
                        if top is not None:
                            top += alts
                        yield TokenChunk(
                            ids, lps, [v] * len(ids), alts if top is not None else None
                        )
                except ServerUnreachable:
                    if self.router is None or seg.ids:
                        raise
                    # The request never reached it: send it to another server.
                    tried.add(url)
                    self.router.mark_down(url)
                    if len(tried) >= len(self.urls):
                        raise
                    self.router.release(url)
                    url = self.router.pick(route_key, exclude=tried)
                    self.router.acquire(url)
                    continue
                finish = seg.finish or {"type": "abort"}
                if finish.get("type") != "abort":
                    break
                raise_if_refused(finish, url, len(prompt_ids) + len(output))
                # Aborted (a weight update paused the server, or someone aborted it):
                # continue from where it stopped, as a new request.
                stalled = 0 if seg.ids else stalled + 1
                if stalled > self.max_resubmits:
                    log.warning("giving up on a request aborted %d times: %s", stalled, finish)
                    break
                if stalled:
                    await asyncio.sleep(min(0.05 * stalled, 1.0))
                self.resubmits += 1
            else:
                finish = {"type": "length"}
        finally:
            if self.router is not None:
                self.router.release(url)
        end = time.perf_counter()
        started = first_token or end
        yield GenerationResult(
            output_ids=output,
            logprobs=logprobs,
            versions=versions,
            finish_reason=finish_reason(finish),
            queue_s=started - submitted if stream else 0.0,
            gen_s=end - started if stream else end - submitted,
            top_logprobs=top,
        )

    def _pick(self, route_key: str | None) -> str:
        if self.router is None:
            return self.urls[0]
        url = self.router.pick(route_key)
        self.router.acquire(url)
        return url

    def _stamp(self, version_before: int, update_epoch: int, seg: _Segment) -> int:
        """The version of a segment's tokens when the server does not report one.

        No update began while the segment was out: the version it was sent under. An
        update began but has not finished: the server made these tokens before the
        pause (it makes none while paused). An update began and finished: the server
        held the request during the update and made them with the new weights.
        """
        if self._updates_started == update_epoch or self._updates_done < self._updates_started:
            return version_before
        if seg.finish is not None and seg.finish.get("type") == "abort":
            return version_before  # cut short by the pause, before the new weights
        return self._version

    def _body(
        self, input_ids: list[int], params: SamplingParams, produced: int, stream: bool
    ) -> bytes:
        return generate_body(input_ids, params, produced, stream, send_seed=self.send_seed)

    async def _segment(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str] | None,
        stream: bool,
        seg: _Segment,
        prompt_len: int,
    ) -> AsyncIterator[tuple[list[int], list[float], list[TopLogprobs], int | None]]:
        """Send one /generate; yield (ids, logprobs, top logprobs, weight version) as
        they come; leave the finish reason in `seg.finish`."""
        assert self._client is not None
        target = f"{url}/generate"
        try:
            if not stream:
                r = await self._client.post(target, body, headers=headers)
                if r.status != 200:
                    raise refusal(url, r.status, r.content, prompt_len)
                out = parse_output(r.content, url)
                ids, lps, alts = new_tokens(out["meta_info"], 0, url)
                seg.ids += ids
                seg.finish = out["meta_info"].get("finish_reason")
                if ids:
                    yield ids, lps, alts, as_int(out["meta_info"].get("weight_version"))
                return
            async with self._client.stream(target, body, headers=headers) as r:
                if r.status != 200:
                    raise refusal(url, r.status, await r.read(), prompt_len)
                async for line in r.lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    out = parse_output(payload, url, prompt_len)
                    meta = out["meta_info"]
                    ids, lps, alts = new_tokens(meta, len(seg.ids), url)
                    seg.ids += ids
                    if ids:
                        yield ids, lps, alts, as_int(meta.get("weight_version"))
                    if meta.get("finish_reason") is not None:
                        seg.finish = meta["finish_reason"]
            if seg.finish is None:
                raise EngineError(f"the SGLang server at {url} ended the stream before finishing")
        except ConnectFailed as exc:
            raise ServerUnreachable(url, exc) from exc
        except TimedOut as exc:
            raise EngineError(
                f"the SGLang server at {url} did not answer within {self.timeout_s:g} s"
            ) from exc
        except HTTPFailed as exc:
            raise EngineError(f"the SGLang server at {url} failed: {exc}") from exc

    async def _fetch_info_later(self) -> None:
        try:
            await self._fetch_info()
        finally:
            self._info_task = None

    # ---- weights ---------------------------------------------------------------------
    async def update_weights_from_disk(self, path: str, version: int | None = None) -> int:
        """Load a checkpoint folder on every server; return the new policy version.

        Callable from any thread's event loop (the trainer's): the work runs on the
        loop the engine was started on, where its HTTP client lives.
        """
        loop = self._loop
        if loop is None or self._client is None:
            raise EngineError("the sglang engine is not started")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        coro = self._update_from_disk(str(path), version)
        if running is loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    async def _update_from_disk(self, path: str, version: int | None) -> int:
        assert self._gate is not None and self._update_lock is not None
        async with self._update_lock:
            new = self._version + 1 if version is None else int(version)
            targets = await self._update_targets()
            self._gate.clear()
            self._updates_started += 1
            paused: list[str] = []
            failures: list[str] = []
            try:
                for url, outcome in zip(
                    targets, await asyncio.gather(*(self._pause(u) for u in targets)), strict=True
                ):
                    if outcome is True:
                        paused.append(url)
                    elif isinstance(outcome, str):
                        failures.append(outcome)
                if not failures:
                    results = await asyncio.gather(
                        *(self._load(u, path, new, abort=u not in paused) for u in targets)
                    )
                    failures = [r for r in results if r]
                if not failures:
                    self._version = new
            finally:
                self._updates_done += 1
                await asyncio.gather(*(self._continue(u) for u in paused))
                self._gate.set()
        if failures:
            raise EngineError("weight update failed: " + "; ".join(failures))
        log.info("loaded %s on %d SGLang server(s): policy version %d", path, len(targets), new)
        return new

    async def _update_targets(self) -> list[str]:
        if self.update_urls:
            return list(self.update_urls)
        targets: list[str] = []
        for url in self.urls:
            workers = await self._router_workers(url)
            for w in workers or [url]:
                if w not in targets:
                    targets.append(w)
        return targets

    async def _router_workers(self, url: str) -> list[str] | None:
        """The workers behind an sglang-router (None: `url` is a server, not a router)."""
        data = await self._get_json(url, "/list_workers")
        if isinstance(data, dict) and data.get("urls"):
            return [normalize_url(u) for u in data["urls"]]
        data = await self._get_json(url, "/workers")
        if isinstance(data, dict) and data.get("workers"):
            return [normalize_url(w["url"]) for w in data["workers"] if w.get("url")]
        return None

    async def _pause(self, url: str) -> bool | str:
        """True: paused; False: the server has no /pause_generation; str: an error."""
        if self.pause_supported.get(url) is False:
            return False
        assert self._client is not None
        try:
            r = await self._client.post(
                f"{url}/pause_generation", b'{"mode": "abort"}', timeout=self.update_timeout_s
            )
        except HTTPFailed as exc:
            return f"{url}/pause_generation: {exc}"
        if r.status in (404, 405):
            self.pause_supported[url] = False
            return False
        if r.status != 200:
            return f"{url}/pause_generation answered {r.status}: {error_message(r.content)}"
        self.pause_supported[url] = True
        return True

    async def _continue(self, url: str) -> None:
        assert self._client is not None
        try:
            r = await self._client.post(
                f"{url}/continue_generation", b"{}", timeout=self.update_timeout_s
            )
            if r.status != 200:
                log.error("%s/continue_generation answered %d", url, r.status)
        except HTTPFailed as exc:
            log.error("%s/continue_generation failed: %r", url, exc)

    async def _load(self, url: str, path: str, version: int, abort: bool) -> str | None:
        """POST /update_weights_from_disk; None on success, else what went wrong."""
        assert self._client is not None
        body = {
            "model_path": path,
            # Without a pause, abort what is in flight (it is resubmitted) rather than
            # wait for it to finish under the old weights.
            "abort_all_requests": abort,
            "weight_version": str(version),
        }
        try:
            r = await self._client.post(
                f"{url}/update_weights_from_disk", dumps(body), timeout=self.update_timeout_s
            )
        except HTTPFailed as exc:
            return f"{url}: {exc}"
        try:
            data = json.loads(r.content)
        except ValueError:
            data = {}
        if r.status != 200 or not (isinstance(data, dict) and data.get("success")):
            message = data.get("message") if isinstance(data, dict) else None
            return f"{url} answered {r.status}: {message or error_message(r.content)}"
        return None


# ---- protocol helpers ----------------------------------------------------------------
