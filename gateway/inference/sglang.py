"""HTTP client of SGLang servers or an sglang-router, on SGLang's native API (token ids
in and out); docs/gateway.md, "Engines: SGLang".

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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway import json_codec
from gateway.inference.base import EngineError, SamplingParams, TopLogprobs
from gateway.inference.remote import (
    Body,
    ControlFailed,
    RemoteEngine,
    Segment,
    ServerOptions,
    Tokens,
    as_int,
    normalize_url,
)
from gateway.token_ids import json_object_with_ids


class SGLangEngine(RemoteEngine):
    name = "sglang"
    label = "SGLang"
    server = "an SGLang server or sglang-router"
    example_url = "http://host:30000"
    # SGLang's own refusals (tokenizer_manager._validate_one_request), so that they
    # become a 400 context_length_exceeded rather than an engine failure.
    too_long = (
        re.compile(
            r"input \((?P<prompt>\d+) tokens\) is longer than the model's context length "
            r"\((?P<context>\d+) tokens\)"
        ),
        re.compile(
            r"exceeds the model's maximum context length of (?P<context>\d+) tokens\. "
            r"You requested a total of \d+ tokens: (?P<prompt>\d+) tokens from the input"
        ),
    )
    pause_call = ("/pause_generation", {"mode": "abort"})
    resume_path = "/continue_generation"
    context_margin = 1  # SGLang refuses input + max_new_tokens >= its context length
    routing_header = "X-SMG-Routing-Key"  # what sglang-router's sticky policies read

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
        self.pause_supported: dict[str, bool] = {}  # learnt at the first update

    async def _server_info(self, url: str) -> tuple[int | None, int | None, bool]:
        ctx, version, answered = await super()._server_info(url)
        if ctx is None:  # older servers: their server info says
            info = await self._get_json(url, "/get_server_info")
            answered = answered or info is not None
            if isinstance(info, dict):
                ctx = as_int(info.get("context_length"))
                max_input = as_int(info.get("max_req_input_len"))
                if ctx is None and max_input is not None:
                    ctx = max_input + 1
        return ctx, version, answered

    def _body(
        self, input_ids: list[int], params: SamplingParams, produced: int, stream: bool
    ) -> Body:
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens - produced,
            "temperature": params.temperature,  # 0: greedy (SGLang: top_k=1)
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if params.seed is not None and self.send_seed:
            # A resubmitted segment is a new request: give it its own stream of randomness.
            sampling["sampling_seed"] = params.seed + produced
        body: dict[str, Any] = {
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,  # output tokens only: no prompt logprobs
            "stream": stream,
        }
        if params.top_logprobs:
            body["top_logprobs_num"] = params.top_logprobs
        return json_object_with_ids("input_ids", input_ids, json_codec.dumps(body))

    def _tokens(self, answer: dict[str, Any], seg: Segment) -> list[Tokens]:
        """The tokens not yet seen in this segment. SGLang sends the whole output so far
        in each stream event, unless it runs with `--incremental-streaming-output` (then
        only what is new): `completion_tokens` tells which."""
        meta = answer["meta_info"]
        if meta.get("finish_reason") is not None:
            seg.finish = meta["finish_reason"]
        triples = meta.get("output_token_logprobs")
        total = meta.get("completion_tokens")
        if triples is None:
            if total:
                raise EngineError(
                    f"the SGLang server at {seg.url} sent no output_token_logprobs (return_logprob)"
                )
            return []
        start = len(seg.ids) if total is None or len(triples) == total else 0
        ids = [int(t[1]) for t in triples[start:]]
        lps = [float(t[0]) if t[0] is not None else 0.0 for t in triples[start:]]
        alts: list[TopLogprobs] = []
        if (tops := meta.get("output_top_logprobs")) is not None:
            alts = [
                [(int(t[1]), float(t[0])) for t in (pos or []) if t[0] is not None]
                for pos in tops[start:]
            ]
            alts += [[] for _ in range(len(ids) - len(alts))]
        seg.ids += ids
        return [(ids, lps, alts, as_int(meta.get("weight_version")))] if ids else []

    def _raise_if_refused(self, finish: dict[str, Any], url: str) -> None:
        """An abort that carries a 4xx status is a refusal, not an interruption."""
        status = finish.get("status_code")
        if isinstance(status, int) and 400 <= status < 500:
            raise self.refusal(url, status, str(finish.get("message") or "request refused"))

    # ---- weights ---------------------------------------------------------------------
    async def _update_targets(self) -> list[str]:
        """Each URL's workers when it is an sglang-router, else the URL itself."""
        if self.update_urls:
            return list(self.update_urls)
        targets: list[str] = []
        for url in self.urls:
            data = await self._get_json(url, "/list_workers")
            workers = data.get("urls") if isinstance(data, dict) else None
            if not workers:
                data = await self._get_json(url, "/workers")
                listed = data.get("workers") if isinstance(data, dict) else None
                workers = [w["url"] for w in listed or [] if w.get("url")]
            for w in [normalize_url(w) for w in workers] or [url]:
                if w not in targets:
                    targets.append(w)
        return targets

    async def _pause(self, url: str) -> bool:
        """False: the server has no /pause_generation (before v0.4.9.post2)."""
        if self.pause_supported.get(url) is False:
            return False
        try:
            await super()._pause(url)
        except ControlFailed as exc:
            if exc.status not in (404, 405):
                raise
            self.pause_supported[url] = False
            return False
        self.pause_supported[url] = True
        return True

    async def _load(self, url: str, path: str, version: int, abort: bool) -> None:
        body = {
            "model_path": path,
            # Without a pause, abort what is in flight (it is resubmitted) rather than
            # wait for it to finish under the old weights.
            "abort_all_requests": abort,
            "weight_version": str(version),
        }
        answer = await self.control(url, "/update_weights_from_disk", body)
        if not (isinstance(answer, dict) and answer.get("success")):
            raise ControlFailed(f"{url}/update_weights_from_disk did not succeed: {answer}")
