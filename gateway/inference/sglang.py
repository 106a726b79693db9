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

Routing, weight-update pauses and resubmission are shared with the vLLM engine
(gateway/inference/remote.py). With one URL (a server, or an `sglang-router` in front
of several) it is used as is; the session id also travels as the `X-SMG-Routing-Key`
header, which sglang-router's `manual` and `consistent_hashing` policies pin sessions by.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from gateway import json_codec
from gateway.inference.base import EngineError, SamplingParams
from gateway.inference.http_client import Body, HTTPFailed
from gateway.inference.remote import (
    RemoteEngine,
    Segment,
    SegmentRequest,
    ServerOptions,
    Tokens,
    as_int,
    normalize_url,
)
from gateway.inference.sglang_protocol import (
    dumps,
    error_message,
    generate_body,
    new_tokens,
    parse_output,
    raise_if_refused,
    refusal,
)

log = logging.getLogger(__name__)

ROUTING_HEADER = "X-SMG-Routing-Key"  # what sglang-router's sticky policies read


class SGLangEngine(RemoteEngine):
    name = "sglang"
    label = "SGLang"
    context_margin = 1  # SGLang refuses input + max_new_tokens >= its context length
    routing_header = ROUTING_HEADER

    def __init__(
        self,
        urls: str | Sequence[str],
        options: ServerOptions | None = None,
        *,
        send_seed: bool = True,
    ) -> None:
        """
        urls: SGLang servers, or one sglang-router. Several: sticky per route key.
        options.update_urls: where weight updates go; default: the servers behind each
            URL (an sglang-router is asked for its workers with `GET /list_workers`).
        send_seed: send `sampling_seed` (SGLang >= 0.5.3; older servers refuse it).
        """
        super().__init__(urls, options or ServerOptions())
        self.send_seed = send_seed

    async def _server_info(self, url: str) -> tuple[int | None, int | None, bool]:
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

    def _body(
        self, input_ids: list[int], params: SamplingParams, produced: int, stream: bool
    ) -> Body:
        return generate_body(input_ids, params, produced, stream, send_seed=self.send_seed)

    def _raise_if_refused(self, finish: dict[str, Any], url: str, prompt_len: int) -> None:
        raise_if_refused(finish, url, prompt_len)

    async def _segment(self, req: SegmentRequest, seg: Segment) -> AsyncIterator[Tokens]:
        """Send one /generate; yield (ids, logprobs, top logprobs, weight version) as
        they come; leave the finish reason in `seg.finish`."""
        assert self._client is not None
        url, prompt_len = req.url, req.prompt_len
        target = f"{url}/generate"
        if not req.stream:
            r = await self._client.post(target, req.body, headers=req.headers)
            if r.status != 200:
                raise refusal(url, r.status, r.content, prompt_len)
            out = parse_output(r.content, url)
            ids, lps, alts = new_tokens(out["meta_info"], 0, url)
            seg.ids += ids
            seg.finish = out["meta_info"].get("finish_reason")
            if ids:
                yield ids, lps, alts, as_int(out["meta_info"].get("weight_version"))
            return
        async with self._client.stream(target, req.body, headers=req.headers) as r:
            if r.status != 200:
                raise refusal(url, r.status, await r.read(), prompt_len)
            async for payload in r.events():
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

    # ---- weights ---------------------------------------------------------------------
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
                f"{url}/pause_generation",
                b'{"mode": "abort"}',
                timeout=self.options.update_timeout_s,
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
                f"{url}/continue_generation", b"{}", timeout=self.options.update_timeout_s
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
                f"{url}/update_weights_from_disk",
                dumps(body),
                timeout=self.options.update_timeout_s,
            )
        except HTTPFailed as exc:
            return f"{url}: {exc}"
        try:
            data = json_codec.loads(r.content)
        except ValueError:
            data = {}
        if r.status != 200 or not (isinstance(data, dict) and data.get("success")):
            message = data.get("message") if isinstance(data, dict) else None
            return f"{url} answered {r.status}: {message or error_message(r.content)}"
        return None
