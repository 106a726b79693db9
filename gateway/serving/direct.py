"""Durable records for generations that bypass the HTTP API.

Token-level workflows and queue-based agents call the inference engine directly, in
token ids. Their generations get the same record as a chat completion (a session per
episode; per generation the exact prompt ids, output ids, logprobs and versions,
committed before the caller sees the tokens), so `turnstile sessions` and the store
show every token the policy produced, whichever agent API produced it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from typing import Any

from gateway.auth import hash_key
from gateway.inference.base import GenerationResult, SamplingParams
from gateway.serving.turn import ChoiceOutput, Turn, completion_record
from gateway.store.recorder import Recorder
from gateway.store.repository import Repository

ENDPOINT = "direct"  # the `endpoint` column of these rows


class DirectRecorder:
    def __init__(
        self, repo: Repository, recorder: Recorder, model: str, session_ttl_s: float
    ) -> None:
        self.repo = repo
        self.recorder = recorder
        self.model = model
        self.session_ttl_s = session_ttl_s

    async def open_session(self, meta: dict[str, Any]) -> str:
        """A session with no usable key: it is written to, never called over HTTP."""
        session_id = "sess-" + uuid.uuid4().hex
        unusable_key_hash = hash_key("direct-" + secrets.token_urlsafe(24))
        await asyncio.to_thread(
            self.repo.create_session, session_id, unusable_key_hash, self.session_ttl_s, meta
        )
        return session_id

    async def record(
        self,
        session_id: str,
        prompt_ids: list[int],
        result: GenerationResult,
        params: SamplingParams,
        request_id: str,
        total_s: float,
    ) -> str:
        """Commit one generation; returns its completion id once it is durable."""
        completion_id = "gen-" + uuid.uuid4().hex
        request = {
            "request_id": request_id,
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
            "seed": params.seed,
        }
        turn = Turn(
            session_id, ENDPOINT, self.model, request, prompt_ids, params, [], None,
            [completion_id], started=time.perf_counter() - total_s,
        )  # fmt: skip
        out = ChoiceOutput(
            0, completion_id, "", result.output_ids, result.logprobs, result.versions, None,
            result.finish_reason, result.queue_s, result.gen_s,
        )  # fmt: skip
        response = {"finish_reason": result.finish_reason}
        record = completion_record(turn, out, response, result.finish_reason, completion_id)
        await self.recorder.record(record)  # queued: a cancelled caller loses nothing
        return completion_id

    async def end_session(self, session_id: str) -> None:
        await asyncio.to_thread(self.repo.end_session, session_id)
