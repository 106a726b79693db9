"""Sessions for generations that bypass the HTTP API (token-level workflows, queue agents).

They are stored like an HTTP agent's: a session per episode, each generation committed
before its caller sees the tokens, with a parent link to the generation whose prompt +
output its prompt continues, so that the turn tree, concat and turn discount work on
them. Rewards, side-request marks and samples go through the same store calls and
`gateway.samples` as the REST API's.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import Counter
from typing import Any

from gateway.auth import hash_key
from gateway.inference.base import GenerationResult, SamplingParams
from gateway.samples import Sample, export_session
from gateway.serving.turn import ChoiceOutput, Parent, Prompt, Turn, completion_record
from gateway.store.delta import continued_length
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
        self._open: dict[str, list[Parent]] = {}  # its generations, by session until it ends
        self._children: Counter[str] = Counter()  # generation id -> children so far

    async def open_session(self, meta: dict[str, Any]) -> str:
        """A session with no usable key: it is written to, never called over HTTP."""
        session_id = "sess-" + uuid.uuid4().hex
        unusable_key_hash = hash_key("direct-" + secrets.token_urlsafe(24))
        await asyncio.to_thread(
            self.repo.create_session, session_id, unusable_key_hash, self.session_ttl_s, meta
        )
        self._open[session_id] = []
        return session_id

    def _parent(self, session_id: str, prompt_ids: list[int]) -> Parent | None:
        """The generation whose prompt + output this prompt continues: the longest; among
        equals (n samples that answered alike) the one with fewest children so far, so
        that each trajectory's next turn hangs under a twin of its own."""
        best, best_key = None, None
        for g in self._open.get(session_id, ()):
            n = len(g.prompt_ids) + len(g.output_ids)
            if not g.output_ids or n > len(prompt_ids):
                continue
            if continued_length(g.prompt_ids, g.output_ids, prompt_ids) != n:
                continue
            key = (n, -self._children[g.id])
            if best_key is None or key > best_key:
                best, best_key = g, key
        return best

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
        parent = self._parent(session_id, prompt_ids)
        if parent is not None:
            self._children[parent.id] += 1  # before any await: a concurrent twin picks another
        prompt = Prompt(prompt_ids, "prompt_ids", parent=parent, continues=True if parent else None)
        turn = Turn(
            session_id=session_id,
            endpoint=ENDPOINT,
            model=self.model,
            request=request,
            prompt=prompt,
            params=params,
            stops=[],
            ids=[completion_id],
            started=time.perf_counter() - total_s,
        )
        out = ChoiceOutput(
            index=0,
            completion_id=completion_id,
            text="",
            output_ids=list(result.output_ids),
            logprobs=list(result.logprobs),
            versions=list(result.versions),
            top_logprobs=None,
            finish_reason=result.finish_reason,
            queue_s=result.queue_s,
            gen_s=result.gen_s,
        )
        response = {"finish_reason": result.finish_reason}
        record = completion_record(turn, out, response, result.finish_reason, completion_id)
        await self.recorder.record(record)  # queued: a cancelled caller loses nothing
        if session_id in self._open:
            self._open[session_id].append(
                Parent(completion_id, list(prompt_ids), out.output_ids, request)
            )
        return completion_id

    async def completions(self, session_id: str) -> list[dict[str, Any]]:
        """The session's stored generations, as `GET /sessions/{id}` lists them."""
        return await asyncio.to_thread(self.repo.completions, session_id)

    async def settle(
        self, session_id: str, rewards: dict[str, float], untrained: list[str]
    ) -> None:
        """Rewards by completion id (the store write of `POST /v1/rewards`); the
        generations in `untrained` become side requests, which exports leave out."""
        if untrained:
            await asyncio.to_thread(self.repo.mark_side_requests, session_id, untrained)
        if rewards:
            await asyncio.to_thread(self.repo.set_rewards, rewards)

    async def export(self, session_id: str, style: str, turn_discount: float) -> list[Sample]:
        """The session's samples, as `GET /sessions/{id}/export` computes them."""
        completions = await self.completions(session_id)
        return export_session(session_id, completions, style, turn_discount)

    async def end_session(self, session_id: str) -> None:
        for generation in self._open.pop(session_id, []):
            self._children.pop(generation.id, None)
        await asyncio.to_thread(self.repo.end_session, session_id)
