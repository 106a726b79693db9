"""Serving `POST /v1/chat/completions`: render, generate, record, answer.

The record is committed before the answer leaves: a client that got a 200 never
loses the tokens, logprobs and policy version behind it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob
from openai.types.completion_usage import CompletionUsage

from gateway.chat_template import ChatRenderer
from gateway.engines.base import (
    ContextLengthExceeded,
    EngineError,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
)
from gateway.errors import APIError
from gateway.linking import candidate_parent_hashes, conversation_hash, tokens_continue
from gateway.metrics import Metrics
from gateway.protocol import ChatCompletionRequest
from gateway.store.codec import pack_floats, pack_ints
from gateway.store.recorder import Recorder, RecordError
from gateway.store.repository import Repository, SessionInfo

_Parent = tuple[str, list[int], list[int]]


class ChatService:
    def __init__(
        self,
        engine: InferenceEngine,
        renderer: ChatRenderer,
        repo: Repository,
        recorder: Recorder,
        metrics: Metrics,
        *,
        model_name: str,
        default_max_tokens: int = 512,
        request_timeout_s: float = 600.0,
        parent_cache_size: int = 50_000,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.repo = repo
        self.recorder = recorder
        self.metrics = metrics
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.request_timeout_s = request_timeout_s
        # (session id, conversation hash) -> parent; saves a DB read per turn.
        self._recent: OrderedDict[tuple[str, str], _Parent] = OrderedDict()
        self._recent_max = parent_cache_size

    async def create(self, req: ChatCompletionRequest, session: SessionInfo) -> dict[str, Any]:
        started = time.perf_counter()
        if req.stream:
            raise APIError(
                400,
                "stream=true is not supported yet by this gateway.",
                code="unsupported",
                param="stream",
                retryable=False,
            )
        if req.n != 1:
            raise APIError(
                400,
                "n>1 is not supported yet by this gateway.",
                code="unsupported",
                param="n",
                retryable=False,
            )

        prompt_ids = self._render(req)
        params = self._sampling_params(req, len(prompt_ids))
        result = await self._generate(prompt_ids, params)
        text, output_ids, finish = self._apply_stop_strings(req, result)

        parent = self._find_parent(session.id, req)
        completion_id = "chatcmpl-" + uuid.uuid4().hex
        message = {"role": "assistant", "content": text}
        answer_hash = conversation_hash([*req.messages, message], req.tools)
        n_out = len(output_ids)
        row = {
            "id": completion_id,
            "session_id": session.id,
            "parent_id": parent[0] if parent else None,
            "created_at": time.time(),
            "endpoint": "chat.completions",
            "model": req.model,
            "request": _request_record(req),
            "response": {"message": message},
            "prompt_ids": pack_ints(prompt_ids),
            "output_ids": pack_ints(output_ids),
            "output_logprobs": pack_floats(result.logprobs[:n_out]),
            "output_versions": pack_ints(result.versions[:n_out]),
            "finish_reason": finish,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": n_out,
            "prefix_hash": answer_hash,
            "tokens_continue_parent": tokens_continue(parent[1], parent[2], prompt_ids)
            if parent
            else None,
            "queue_s": result.queue_s,
            "gen_s": result.gen_s,
            "total_s": time.perf_counter() - started,
        }
        try:
            await self.recorder.record(row)
        except RecordError as exc:
            self.metrics.inc("turnstile_record_failures_total")
            raise APIError(503, str(exc), code="record_failed") from exc
        self._remember(session.id, answer_hash, (completion_id, prompt_ids, output_ids))
        self.metrics.inc("turnstile_completions_total")
        self.metrics.inc("turnstile_prompt_tokens_total", len(prompt_ids))
        self.metrics.inc("turnstile_completion_tokens_total", n_out)
        self.metrics.observe("turnstile_completion_seconds", time.perf_counter() - started)
        return self._response(req, completion_id, text, finish, prompt_ids, output_ids, result)

    # ---- steps -----------------------------------------------------------------------
    def _render(self, req: ChatCompletionRequest) -> list[int]:
        try:
            return self.renderer.render(req.messages, req.tools)
        except Exception as exc:  # jinja errors, bad message shapes
            raise APIError(
                400,
                f"could not apply the chat template: {exc}",
                code="invalid_messages",
                param="messages",
            ) from exc

    def _sampling_params(self, req: ChatCompletionRequest, prompt_len: int) -> SamplingParams:
        wanted = req.max_completion_tokens or req.max_tokens or self.default_max_tokens
        try:
            max_new = self.engine.check_fits(prompt_len, wanted)
        except ContextLengthExceeded as exc:
            raise APIError(
                400, str(exc), code="context_length_exceeded", param="messages", retryable=False
            ) from exc
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            stop_token_ids=self.renderer.stop_token_ids,
            seed=req.seed,
        )

    async def _generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        try:
            return await asyncio.wait_for(
                self.engine.generate(prompt_ids, params), self.request_timeout_s
            )
        except asyncio.TimeoutError as exc:
            self.metrics.inc("turnstile_engine_errors_total")
            raise APIError(
                503,
                f"the inference engine did not answer within {self.request_timeout_s:.0f} s",
                code="engine_timeout",
            ) from exc
        except EngineError as exc:
            self.metrics.inc("turnstile_engine_errors_total")
            raise APIError(
                503, f"the inference engine is unavailable: {exc}", code="engine_unavailable"
            ) from exc

    def _apply_stop_strings(
        self, req: ChatCompletionRequest, result: GenerationResult
    ) -> tuple[str, list[int], str]:
        """Cut the answer at the first stop string; keep the tokens that produced it."""
        text = self.renderer.decode_output(result.output_ids)
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        hits = [(text.find(s), s) for s in stops if s and s in text]
        if not hits:
            return text, result.output_ids, result.finish_reason
        cut, _ = min(hits)
        ids = result.output_ids
        for k in range(1, len(ids) + 1):  # fewest tokens whose text reaches the stop string
            if len(self.renderer.decode_output(ids[:k])) > cut and any(
                s in self.renderer.decode_output(ids[:k]) for _, s in hits
            ):
                return text[:cut], ids[:k], "stop"
        return text[:cut], ids, "stop"

    def _find_parent(self, session_id: str, req: ChatCompletionRequest) -> _Parent | None:
        hashes = candidate_parent_hashes(req.messages, req.tools)
        for h in hashes:
            hit = self._recent.get((session_id, h))
            if hit is not None:
                return hit
        if not hashes:
            return None
        from gateway.store.codec import unpack_ints

        found = self.repo.find_parent(session_id, hashes)
        if found is None:
            return None
        return found[0], unpack_ints(found[1]), unpack_ints(found[2])

    def _remember(self, session_id: str, h: str, parent: _Parent) -> None:
        self._recent[(session_id, h)] = parent
        if len(self._recent) > self._recent_max:
            self._recent.popitem(last=False)

    def _response(
        self,
        req: ChatCompletionRequest,
        completion_id: str,
        text: str,
        finish: str,
        prompt_ids: list[int],
        output_ids: list[int],
        result: GenerationResult,
    ) -> dict[str, Any]:
        logprobs = None
        if req.logprobs:
            tok = self.renderer.tokenizer
            logprobs = ChoiceLogprobs.model_construct(
                content=[
                    ChatCompletionTokenLogprob.model_construct(
                        token=(piece := tok.decode([tid])),
                        logprob=lp,
                        bytes=list(piece.encode()),
                        top_logprobs=[],
                    )
                    for tid, lp in zip(output_ids, result.logprobs, strict=False)
                ]
            )
        completion = ChatCompletion.model_construct(
            id=completion_id,
            object="chat.completion",
            created=int(time.time()),
            model=req.model,
            choices=[
                Choice.model_construct(
                    index=0,
                    finish_reason=finish,
                    logprobs=logprobs,
                    message=ChatCompletionMessage.model_construct(role="assistant", content=text),
                )
            ],
            usage=CompletionUsage.model_construct(
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(output_ids),
                total_tokens=len(prompt_ids) + len(output_ids),
            ),
        )
        return completion.model_dump(mode="json", exclude_unset=True)


def _request_record(req: ChatCompletionRequest) -> dict[str, Any]:
    """What the client asked for, as stored with the completion."""
    return req.model_dump(exclude_none=True, exclude_defaults=False)
