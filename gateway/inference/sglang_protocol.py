"""SGLang's wire format: `/generate` request bodies, answers, refusals.

Kept apart from the client (gateway/inference/sglang.py) the way protocol types sit
apart from serving logic: this module knows field names, the client knows HTTP.
Sources are listed in the client's docstring.
"""

from __future__ import annotations

import re
from typing import Any

from gateway import json_codec
from gateway.inference.base import (
    ContextLengthExceeded,
    EngineError,
    SamplingParams,
    TopLogprobs,
)
from gateway.inference.http_client import Body
from gateway.inference.remote import error_message
from gateway.token_ids import json_object_with_ids

# SGLang's own refusals (tokenizer_manager._validate_one_request), so that they become
# a 400 context_length_exceeded rather than an engine failure.
INPUT_TOO_LONG = re.compile(
    r"input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"
)
TOTAL_TOO_LONG = re.compile(
    r"exceeds the model's maximum context length of (\d+) tokens\. "
    r"You requested a total of (\d+) tokens: (\d+) tokens from the input"
)


def generate_body(
    input_ids: list[int], params: SamplingParams, produced: int, stream: bool, send_seed: bool
) -> Body:
    """A `/generate` request; `produced` tokens of this request were made already."""
    sampling: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens - produced,
        "temperature": params.temperature,  # 0: greedy (SGLang: top_k=1)
        "top_p": params.top_p,
        "stop_token_ids": list(params.stop_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if params.seed is not None and send_seed:
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
    return json_object_with_ids("input_ids", input_ids, dumps(body))


def dumps(obj: Any) -> bytes:
    return json_codec.dumps(obj)


def parse_output(raw: bytes | str, url: str, prompt_len: int = 0) -> dict[str, Any]:
    try:
        out = json_codec.loads(raw)
    except ValueError as exc:
        raise EngineError(f"the SGLang server at {url} sent something that is not JSON") from exc
    if isinstance(out, dict) and "error" in out and "meta_info" not in out:
        # A refusal sent as a stream event (HTTP 200 already sent).
        raise refusal(url, 400, raw, prompt_len)
    if not isinstance(out, dict) or not isinstance(out.get("meta_info"), dict):
        raise EngineError(f"the SGLang server at {url} answered without meta_info")
    return out


def new_tokens(
    meta: dict[str, Any], have: int, url: str
) -> tuple[list[int], list[float], list[TopLogprobs]]:
    """Token ids, logprobs and top logprobs not yet seen in this segment.

    SGLang sends the whole output so far in each stream event, unless it runs with
    `--incremental-streaming-output` (then only what is new): `completion_tokens`
    tells which.
    """
    triples = meta.get("output_token_logprobs")
    if triples is None:
        if meta.get("completion_tokens"):
            raise EngineError(
                f"the SGLang server at {url} sent no output_token_logprobs (return_logprob)"
            )
        return [], [], []
    total = meta.get("completion_tokens")
    cumulative = total is None or len(triples) == total
    start = have if cumulative else 0
    new = triples[start:]
    ids = [int(t[1]) for t in new]
    lps = [float(t[0]) if t[0] is not None else 0.0 for t in new]
    tops = meta.get("output_top_logprobs")
    alts: list[TopLogprobs] = []
    if tops is not None:
        alts = [
            [(int(t[1]), float(t[0])) for t in (pos or []) if t[0] is not None]
            for pos in tops[start:]
        ]
        alts += [[] for _ in range(len(ids) - len(alts))]
    return ids, lps, alts


def refusal(url: str, status: int, raw: bytes | str, prompt_len: int) -> Exception:
    message = error_message(raw)
    too_long = context_refusal(message, prompt_len)
    if too_long is not None:
        return too_long
    return EngineError(f"the SGLang server at {url} answered {status}: {message}")


def context_refusal(message: str, prompt_len: int) -> ContextLengthExceeded | None:
    m = INPUT_TOO_LONG.search(message)
    if m:
        return ContextLengthExceeded(int(m.group(1)), int(m.group(2)))
    m = TOTAL_TOO_LONG.search(message)
    if m:
        return ContextLengthExceeded(int(m.group(3)), int(m.group(1)))
    return None


def raise_if_refused(finish: dict[str, Any], url: str, prompt_len: int) -> None:
    """An abort that carries a 4xx status is a refusal, not an interruption."""
    status = finish.get("status_code")
    if isinstance(status, int) and 400 <= status < 500:
        message = str(finish.get("message") or "request refused")
        too_long = context_refusal(message, prompt_len)
        if too_long is not None:
            raise too_long
        raise EngineError(f"the SGLang server at {url} refused the request: {message}")
