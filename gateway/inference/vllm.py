"""HTTP client of one or more vLLM servers, on vLLM's token-in/token-out API.

The gateway renders the chat template and tokenizes; vLLM only sees token ids on
`POST /inference/v1/generate` and answers token ids, the logprob of each sampled
token and, per span of tokens, the weight version that made them. Nothing is
re-tokenized on either side. (Wire format: vllm_protocol.py.)

The servers are started with (deploy/vllm/):
- `--enable-scale-out`: serves `/inference/v1/generate`;
- `VLLM_SERVER_DEV_MODE=1`: serves the control endpoints used for weight updates,
  `/pause?mode=abort`, `/resume`, `/collective_rpc`, `/update_weight_version`,
  `/weight_info`, `/reset_prefix_cache`;
- `--worker-extension-cls gateway.inference.vllm_worker_extension.WeightReceiverExtension`
  (this repository on the server's PYTHONPATH): our methods in each worker, for weight
  loads from a folder and from a broadcast;
- `--logprobs-mode processed_logprobs`: logprobs of the temperature-scaled
  distribution the token was sampled from (the behaviour policy, as the embedded
  engine records); vLLM's default is the raw model's.

A weight update, on every server: `/pause?mode=abort` (what is generating comes back
with finish_reason "abort" and is resubmitted, remote.py), `/collective_rpc`
`turnstile_reload_weights` (our worker extension: vLLM's in-place `reload_weights`
from the checkpoint folder the trainer wrote, then the tied lm_head packed again),
or, without disk, a broadcast into the workers (vllm_weights.py),
`/reset_prefix_cache` (no KV of the old weights is reused), `/update_weight_version`,
then `/resume`. Each answer labels its tokens with the weight version, so recorded
versions are the server's own; streamed tokens, labelled only at the end of a stream,
are stamped by the pause protocol (remote.py `_stamp`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from gateway import json_codec
from gateway.inference.base import EngineError, SamplingParams
from gateway.inference.http_client import Body
from gateway.inference.remote import RemoteEngine, Segment, SegmentRequest, Tokens, as_int
from gateway.inference.vllm_protocol import (
    GENERATE_PATH,
    choice_tokens,
    finish,
    generate_body,
    parse_choice,
    refusal,
    version_spans,
)

log = logging.getLogger(__name__)

DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (deploy/vllm/)"
EXTENSION = "gateway.inference.vllm_worker_extension.WeightReceiverExtension"
EXTENSION_HINT = (
    f"start vLLM with --worker-extension-cls {EXTENSION} and this repository on its "
    "PYTHONPATH (deploy/vllm/)"
)


class VLLMEngine(RemoteEngine):
    name = "vllm"
    label = "vLLM"
    context_margin = 0  # vLLM serves prompt + max_tokens up to max_model_len

    async def _server_info(self, url: str) -> tuple[int | None, int | None, bool]:
        ctx: int | None = None
        version: int | None = None
        models = await self._get_json(url, "/v1/models")
        if isinstance(models, dict) and models.get("data"):
            ctx = as_int(models["data"][0].get("max_model_len"))
        info = await self._get_json(url, "/weight_info")  # dev mode only
        if isinstance(info, dict):
            version = as_int(info.get("weight_version"))
        return ctx, version, models is not None

    def _body(
        self, input_ids: list[int], params: SamplingParams, produced: int, stream: bool
    ) -> Body:
        return generate_body(input_ids, params, produced, stream)

    async def _segment(self, req: SegmentRequest, seg: Segment) -> AsyncIterator[Tokens]:
        assert self._client is not None
        url, prompt_len, top_k = req.url, req.prompt_len, req.params.top_logprobs
        target = f"{url}{GENERATE_PATH}"
        if not req.stream:
            r = await self._client.post(target, req.body, headers=req.headers)
            if r.status != 200:
                raise refusal(url, r.status, r.content, prompt_len)
            choice = parse_choice(r.content, url, prompt_len)
            ids, lps, alts = choice_tokens(choice, url, top_k)
            seg.ids += ids
            seg.finish = finish(choice)
            spans = version_spans(choice) or [(None, 0, len(ids))]
            for version, start, end in spans:
                if end > start:
                    yield ids[start:end], lps[start:end], alts[start:end], version
            return
        async with self._client.stream(target, req.body, headers=req.headers) as r:
            if r.status != 200:
                raise refusal(url, r.status, await r.read(), prompt_len)
            async for payload in r.events():
                choice = parse_choice(payload, url, prompt_len)
                ids, lps, alts = choice_tokens(choice, url, top_k)
                seg.ids += ids
                if ids:
                    yield ids, lps, alts, None
                if choice.get("finish_reason") is not None:
                    seg.finish = finish(choice)
        if seg.finish is None:
            raise EngineError(f"the vLLM server at {url} ended the stream before finishing")

    # ---- weights ---------------------------------------------------------------------
    async def _pause(self, url: str) -> bool | str:
        error = await self._post(url, "/pause?mode=abort&clear_cache=true")
        if error is None:
            return True
        if " answered 404" in error:
            return f"{error} ({DEV_MODE_HINT})"
        return error

    async def _continue(self, url: str) -> None:
        error = await self._post(url, "/resume")
        if error:
            log.error("%s", error)

    async def _load(self, url: str, path: str, version: int, abort: bool) -> str | None:
        # vLLM's `reload_weights`, then a tied lm_head packed again: without that, vLLM
        # CPU keeps serving the old head (vllm_worker_extension.py)
        rpc = {"method": "turnstile_reload_weights", "kwargs": {"weights_path": path}}
        steps: list[tuple[str, dict[str, Any]]] = [
            ("/collective_rpc", rpc),
            ("/reset_prefix_cache", {}),
            ("/update_weight_version", {"new_version": str(version)}),
        ]
        for path_, body in steps:
            error = await self._post(url, path_, _dumps(body))
            if error is not None:
                if " answered 404" in error:
                    return f"{error} ({DEV_MODE_HINT})"
                return f"{error} ({EXTENSION_HINT})" if "turnstile_" in error else error
        return None


def _dumps(obj: Any) -> bytes:
    return json_codec.dumps(obj)
