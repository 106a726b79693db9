"""What every engine on external inference servers shares (SGLang, vLLM).

A server kind's subclass (`sglang.py`, `vllm.py`) holds only its protocol. Here, once:
sticky routing over several servers (routing.py); weight updates that keep per-token
versions exact as AReaL's remote engines do (new requests wait, the servers are paused,
aborting what they generate, loaded and resumed; an aborted request is resubmitted with
the tokens it already has); the error kinds: `ServerUnreachable`, `EngineError` (the
gateway's 503), `ContextLengthExceeded` (a 400). docs/gateway.md, "Engines", says more.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway import json_codec
from gateway.inference.base import (
    ContextLengthExceeded,
    EngineError,
    FinishReason,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    TokenChunk,
    TopLogprobs,
)
from gateway.inference.routing import StickyRouter
from gateway.token_ids import TokenIds

log = logging.getLogger(__name__)

# What one server answer adds: token ids, their logprobs, their top alternatives, and
# the weight version the server says made them (None: it does not say).
Tokens = tuple[list[int], list[float], list[TopLogprobs], int | None]
# Loads new weights on one server: (url, new version, abort); raises ControlFailed.
Loader = Callable[[str, int, bool], Awaitable[object]]
# A request body: bytes, or its parts in order (a long prompt's JSON is kept in parts,
# gateway/token_ids.py)
Body = bytes | tuple[bytes | memoryview, ...]
# What a request that gets no answer raises: aiohttp's errors, and its timeouts
HTTP_ERRORS = (aiohttp.ClientError, TimeoutError)
KEEPALIVE_S = 3.0  # below the servers' own idle limit (uvicorn's 5 s)
# the connection broke before an answer: a control call (pause, load, resume) is safe
# to send again
UNSENT = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)


class ServerUnreachable(EngineError):
    """No connection could be made: the request never reached the server."""


class Unanswered(EngineError):
    """The connection broke before any answer (a kept-alive one the server closed as it
    was reused): nothing was generated for us, so the request may be sent again."""


@dataclass(slots=True)
class Segment:
    """One server request, a segment of a generation (after an abort, the next one
    carries the prompt plus the tokens made so far), and what it returned: `finish` is
    {"type": "stop" | "length" | "abort", ...} once the server says."""

    url: str
    body: Body
    headers: dict[str, str] | None
    stream: bool
    params: SamplingParams
    ids: list[int] = field(default_factory=list)
    finish: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How the gateway talks to its inference servers; the defaults suit one server.

    update_urls: where weight updates go; empty: `RemoteEngine._update_targets()`.
    max_context: an override; None: asked from the servers at start().
    fallback_max_context: when no server can tell (or none is up at start).
    max_route_keys: sessions remembered by the sticky router (several servers).
    max_resubmits: aborted segments in a row, without progress, before giving up.
    api_key: the servers' `--api-key`, sent as a bearer token.
    """

    update_urls: tuple[str, ...] = ()
    max_context: int | None = None
    fallback_max_context: int = 4096
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    health_timeout_s: float = 30.0
    update_timeout_s: float = 1800.0
    max_connections: int = 1024
    max_route_keys: int = 100_000
    max_resubmits: int = 16
    api_key: str | None = field(default=None, repr=False)  # never in a log line


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    return url


def as_int(value: Any) -> int | None:
    """An int, or a string of one (servers write weight versions as either); else None."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value if type(value) is int else None


def error_message(raw: bytes | str) -> str:
    """The message in an engine server's error body (JSON `error.message`, `message`,
    `detail` or `error`, else the text), for the errors we raise."""
    try:
        data = json_codec.loads(raw)
    except ValueError:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        return text.strip()[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])
    return str(data)[:500]


def open_session(options: ServerOptions) -> aiohttp.ClientSession:
    """The one HTTP session to the servers, aiohttp's public knobs set for one kind of
    peer: no cookies, no compression, no headers of its own, one deadline a request."""
    headers = {"Content-Type": "application/json"}
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    return aiohttp.ClientSession(
        # uvicorn (vLLM's and SGLang's servers) closes a connection idle for 5 s: one
        # reused just as it closes cannot take the request, so ours are dropped sooner
        connector=aiohttp.TCPConnector(
            limit=options.max_connections, keepalive_timeout=KEEPALIVE_S
        ),
        headers=headers,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(options.timeout_s, connect=options.connect_timeout_s),
    )


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def sse_events(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The `data:` payloads of a server-sent event stream, up to `[DONE]`. Split here:
    aiohttp's line reader refuses lines over 512 kB, and SGLang's cumulative events
    grow past that on long answers with top logprobs."""
    rest = b""
    async for chunk in content.iter_any():
        *lines, rest = (rest + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                yield payload
    payload = rest[5:].strip()
    if rest.startswith(b"data:") and payload != b"[DONE]":
        yield payload


async def _one(answer: bytes) -> AsyncIterator[bytes]:
    yield answer


def finish_reason(finish: dict[str, Any]) -> FinishReason:
    kind = finish.get("type")
    if kind == "length" or kind == "abort":
        return kind
    return "stop"


class ControlFailed(EngineError):
    """A control call (pause, load, ...) failed; `status` is the HTTP status, 0: none."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class RemoteEngine(InferenceEngine):
    """An engine whose model runs in one or more inference servers reached over HTTP."""

    name = "remote"
    label = "inference"  # the servers' name in messages: "the vLLM server at ..."
    server = "an inference server"  # what --engine-url names, and an example URL
    example_url = "http://host:8000"
    generate_path = "/generate"
    version_path = "/get_model_info"  # answers {"weight_version": ...}
    # What every answer (or stream event) holds; an `error` without it is a refusal.
    answer_key = "meta_info"
    # The server's refusals of an over-long prompt, with groups `prompt` and `context`.
    too_long: tuple[re.Pattern[str], ...] = ()
    pause_call: tuple[str, Any] = ("/pause", None)  # pauses a server, aborting its requests
    resume_path = "/resume"  # lets a paused server generate again
    # The server refuses prompt + max new tokens >= its context length minus this.
    context_margin = 0
    # A header that carries the route key, for a router in front of several servers.
    routing_header: str | None = None

    def __init__(self, urls: str | Sequence[str], options: ServerOptions = ServerOptions()) -> None:
        """urls: the servers (or one router in front of several). Several: sticky per
        route key."""
        url_list = [urls] if isinstance(urls, str) else list(urls)
        if not url_list:
            raise ValueError(
                f"the {self.name} engine needs the URL of {self.server} (--engine-url "
                f"{self.example_url}, or gateway.engine_urls in the config)"
            )
        self.options = options
        self.urls = [normalize_url(u) for u in url_list]
        self.update_urls = [normalize_url(u) for u in options.update_urls] or None
        self.router = (
            StickyRouter(self.urls, max_keys=options.max_route_keys) if len(self.urls) > 1 else None
        )
        self._server_context: int | None = None
        self._client: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._version = 0
        # Weight updates: new segments wait on the gate; `_started`/`_done` count updates.
        self._gate: asyncio.Event | None = None
        self._update_lock: asyncio.Lock | None = None
        self._updates_started = 0
        self._updates_done = 0
        self._info_task: asyncio.Task[None] | None = None
        self._info_next_try = 0.0
        self.resubmits = 0  # segments sent again after an abort (weight updates)

    # ---- what a server kind defines -----------------------------------------------------
    @abc.abstractmethod
    def _body(
        self, input_ids: list[int], params: SamplingParams, produced: int, stream: bool
    ) -> Body:
        """One generation request; `produced` tokens of it were made already."""

    @abc.abstractmethod
    def _tokens(self, answer: dict[str, Any], seg: Segment) -> list[Tokens]:
        """What one answer (or stream event) adds; records its ids and finish in `seg`."""

    async def _pause(self, url: str) -> bool:
        """Pause a server, aborting what it generates. True: paused; False: the server
        cannot pause (the load must abort); ControlFailed: it failed."""
        await self.control(url, *self.pause_call)
        return True

    @abc.abstractmethod
    async def _load(self, url: str, path: str, version: int, abort: bool) -> None:
        """Load a checkpoint folder on one server; ControlFailed: what failed."""

    def _raise_if_refused(self, finish: dict[str, Any], url: str) -> None:
        """An abort may really be a refusal (raise it then); default: it is not."""

    def _hint(self, status: int, message: str) -> str:
        """What to add to a failed control call's message (how to start the server)."""
        return ""

    async def _update_targets(self) -> list[str]:
        """The servers that weight updates go to (default: the --engine-url servers)."""
        return list(self.update_urls or self.urls)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        if self._client is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._gate = asyncio.Event()
        self._gate.set()
        self._update_lock = asyncio.Lock()
        self._client = open_session(self.options)
        if not await self._fetch_info():
            log.warning(
                "no %s server answered at %s; serving anyway (max context %d until one does)",
                self.label,
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
        if self.options.max_context:
            return self.options.max_context
        if self._server_context:
            return self._server_context - self.context_margin
        return self.options.fallback_max_context

    async def health(self) -> bool:
        if self._client is None:
            return False
        timeout = self.options.health_timeout_s
        replies = await asyncio.gather(*(self._get(f"{u}/health", timeout) for u in self.urls))
        ok = [r is not None for r in replies]
        if self.router is not None:
            for url, up in zip(self.urls, ok, strict=True):
                (self.router.mark_up if up else self.router.mark_down)(url)
        if any(ok) and self._server_context is None and self.options.max_context is None:
            await self._fetch_info()
        return any(ok)

    async def _get(self, url: str, timeout_s: float) -> bytes | None:
        """GET: the body of a 200, else None."""
        assert self._client is not None
        timeout = aiohttp.ClientTimeout(timeout_s, connect=self.options.connect_timeout_s)
        try:
            async with self._client.get(url, timeout=timeout) as r:
                return await r.read() if r.status == 200 else None
        except HTTP_ERRORS:
            return None

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
        models = await self._get_json(url, "/v1/models")
        info = await self._get_json(url, self.version_path)
        data = models.get("data") if isinstance(models, dict) else None
        ctx = as_int(data[0].get("max_model_len")) if data else None
        version = as_int(info.get("weight_version")) if isinstance(info, dict) else None
        return ctx, version, models is not None or info is not None

    async def _get_json(self, url: str, path: str) -> Any:
        content = await self._get(f"{url}{path}", self.options.connect_timeout_s + 10)
        try:
            return None if content is None else json_codec.loads(content)
        except ValueError:
            return None

    async def control(self, url: str, path: str, body: Any = None) -> Any:
        """POST to a control endpoint (pause, load, ...): its JSON answer (None: none).

        Raises ControlFailed, its message with the server kind's hint."""
        assert self._client is not None
        payload = json_codec.dumps({} if body is None else body)
        timeout = aiohttp.ClientTimeout(
            self.options.update_timeout_s, connect=self.options.connect_timeout_s
        )
        for attempt in (1, 2):
            try:
                async with self._client.post(f"{url}{path}", data=payload, timeout=timeout) as r:
                    status, content = r.status, await r.read()
                break
            except UNSENT as exc:  # e.g. a kept-alive connection closed as it was reused
                if attempt == 2:
                    raise ControlFailed(f"{url}{path}: {describe(exc)}") from exc
            except HTTP_ERRORS as exc:
                raise ControlFailed(f"{url}{path}: {describe(exc)}") from exc
        if status != 200:
            message = error_message(content)
            hint = self._hint(status, message)
            raise ControlFailed(f"{url}{path} answered {status}: {message}{hint}", status)
        try:
            return json_codec.loads(content) if content else None
        except ValueError:
            return None

    async def _continue(self, url: str) -> None:
        """Let a paused server generate again."""
        try:
            await self.control(url, self.resume_path)
        except ControlFailed as exc:
            log.error("%s", exc)

    # ---- generation ------------------------------------------------------------------
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> GenerationResult:
        result: GenerationResult | None = None
        async for item in self.stream(prompt_ids, params, route_key=route_key, sse=False):
            if isinstance(item, GenerationResult):
                result = item
        assert result is not None
        return result

    async def stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        route_key: str | None = None,
        sse: bool = True,  # False: the server sends one answer at the end (generate)
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        if self._client is None or self._gate is None:
            raise EngineError(f"the {self.name} engine is not started")
        if not prompt_ids:
            raise ValueError("prompt must contain at least one token")
        if (
            self._server_context is None
            and self.options.max_context is None
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
        resent = False  # once, after a connection broke before any answer
        stalled = 0  # consecutive aborted segments that made no progress
        try:
            while len(output) < params.max_new_tokens:
                if not self._gate.is_set():
                    await self._gate.wait()
                version_before, update_epoch = self._version, self._updates_started
                # (the prompt as it is: a long session's ids are shared, not copied, and
                # written as JSON once; see gateway/token_ids.py)
                ids = TokenIds.joined(prompt_ids, output) if output else prompt_ids
                body = self._body(ids, params, len(output), sse)
                headers = (
                    {self.routing_header: route_key} if route_key and self.routing_header else None
                )
                seg = Segment(url, body, headers, sse, params)
                segment_version: int | None = None
                try:
                    async for ids, lps, alts, weight_version in self._segment(seg):
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
                except Unanswered:
                    if resent:
                        raise
                    resent = True
                    continue
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
                finish: dict[str, Any] = seg.finish or {"type": "abort"}
                if finish.get("type") != "abort":
                    break
                self._raise_if_refused(finish, url)
                # Aborted (a weight update paused the server, or someone aborted it):
                # continue from where it stopped, as a new request.
                stalled = 0 if seg.ids else stalled + 1
                if stalled > self.options.max_resubmits:
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
            queue_s=started - submitted if sse else 0.0,
            gen_s=end - started if sse else end - submitted,
            top_logprobs=top,
        )

    async def _segment(self, seg: Segment) -> AsyncIterator[Tokens]:
        """Send one request; yield tokens as they come; leave the finish in `seg.finish`.

        HTTP failures become engine errors here."""
        assert self._client is not None
        url, body = seg.url, seg.body
        data = body if isinstance(body, bytes) else b"".join(body)
        answered = False
        try:
            async with self._client.post(
                f"{url}{self.generate_path}", data=data, headers=seg.headers
            ) as r:
                answered = True
                if r.status != 200:
                    raise self.refusal(url, r.status, await r.read())
                answers = sse_events(r.content) if seg.stream else _one(await r.read())
                async for answer in answers:
                    for tokens in self._tokens(self.parse_answer(answer, url), seg):
                        yield tokens
        except aiohttp.ClientConnectorError as exc:  # (not a connect timeout)
            raise ServerUnreachable(
                f"cannot reach the {self.label} server at {url}: {describe(exc)}"
            ) from exc
        except TimeoutError as exc:
            raise EngineError(
                f"the {self.label} server at {url} did not answer within "
                f"{self.options.timeout_s:g} s"
            ) from exc
        except aiohttp.ClientError as exc:
            message = f"the {self.label} server at {url} failed: {describe(exc)}"
            if isinstance(exc, UNSENT) and not answered:
                raise Unanswered(message) from exc
            raise EngineError(message) from exc
        if seg.finish is None:
            raise EngineError(f"the {self.label} server at {url} ended the stream before finishing")

    def parse_answer(self, raw: bytes | str, url: str) -> dict[str, Any]:
        """One answer or stream event, read as JSON; a refusal inside it is raised."""
        try:
            out = json_codec.loads(raw)
        except ValueError as exc:
            raise EngineError(
                f"the {self.label} server at {url} sent something that is not JSON"
            ) from exc
        if isinstance(out, dict) and "error" in out and self.answer_key not in out:
            raise self.refusal(url, 400, raw)  # sent as a stream event (after HTTP 200)
        value = out.get(self.answer_key) if isinstance(out, dict) else None
        if isinstance(value, list):  # choices: the first one is read
            value = value[0] if value else None
        if not isinstance(value, dict):
            raise EngineError(
                f"the {self.label} server at {url} answered without {self.answer_key}"
            )
        return out

    def refusal(self, url: str, status: int, raw: bytes | str) -> Exception:
        """The error for a refused request: a too-long prompt is ContextLengthExceeded."""
        message = error_message(raw)
        for pattern in self.too_long:
            if m := pattern.search(message):
                return ContextLengthExceeded(int(m["prompt"]), int(m["context"]))
        return EngineError(f"the {self.label} server at {url} answered {status}: {message}")

    def forget_route(self, route_key: str) -> None:
        if self.router is not None:
            self.router.forget(route_key)

    def _pick(self, route_key: str | None) -> str:
        if self.router is None:
            return self.urls[0]
        url = self.router.pick(route_key)
        self.router.acquire(url)
        return url

    def _stamp(self, version_before: int, update_epoch: int, seg: Segment) -> int:
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

    async def _fetch_info_later(self) -> None:
        try:
            await self._fetch_info()
        finally:
            self._info_task = None

    # ---- weights ---------------------------------------------------------------------
    async def update_weights_from_disk(self, path: str, version: int | None = None) -> int:
        """Load a checkpoint folder on every server; return the new policy version."""
        path = str(path)
        return await self.update_weights_with(
            lambda url, new, abort: self._load(url, path, new, abort), version, path
        )

    async def update_weights_with(self, load: Loader, version: int | None, what: str) -> int:
        """Pause every server, `load(url, new_version, abort)` on each, resume them.

        The update protocol whatever the weights come from (a folder here, a broadcast
        in weight_receiver.py). Callable from any thread's event loop (the trainer's): the
        work runs on the loop the engine was started on, where its HTTP client lives.
        """
        loop = self._loop
        if loop is None or self._client is None:
            raise EngineError(f"the {self.name} engine is not started")
        coro = self._update(load, version, what)
        if asyncio.get_running_loop() is loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    async def _update(self, load: Loader, version: int | None, what: str) -> int:
        assert self._gate is not None and self._update_lock is not None
        async with self._update_lock:
            new = self._version + 1 if version is None else int(version)
            targets = await self._update_targets()
            self._gate.clear()
            self._updates_started += 1
            paused: list[str] = []
            try:
                outcomes = await _settled(self._pause(u) for u in targets)
                paused = [u for u, o in zip(targets, outcomes, strict=True) if o is True]
                failures = [str(o) for o in outcomes if isinstance(o, ControlFailed)]
                if not failures:
                    results = await _settled(load(u, new, u not in paused) for u in targets)
                    failures = [str(r) for r in results if isinstance(r, ControlFailed)]
                if not failures:
                    self._version = new
            finally:
                self._updates_done += 1
                await asyncio.gather(*(self._continue(u) for u in paused))
                self._gate.set()
        if failures:
            raise EngineError("weight update failed: " + "; ".join(failures))
        log.info(
            "loaded %s on %d %s server(s): policy version %d", what, len(targets), self.label, new
        )
        return new


async def _settled(calls: Iterable[Awaitable[Any]]) -> list[Any]:
    """Each call's result, or its ControlFailed; any other error is raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, ControlFailed):
            raise r
    return results
