"""Serving `POST /v1/completions`: a raw prompt (text or token ids) in, text out.

No chat template: the prompt's tokens go to the engine as given (token ids exactly,
text tokenised without special tokens added). Each prompt x `n` is one recorded
completion, rewardable by its id; choice `i` of prompt `p` has index `p * n + i`.
Parent links are a chat-messages notion and are not made here.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse
from openai.types import Completion, CompletionChoice
from openai.types.completion_choice import Logprobs
from openai.types.completion_usage import CompletionUsage

from gateway.errors import APIError
from gateway.protocol import CompletionRequest
from gateway.serving_core import (
    STREAM_END,
    ChoiceOutput,
    Frames,
    ServingCore,
    TextDelta,
    Turn,
    choice_ids,
)
from gateway.sse import SSE_DONE, sse_event, sse_response
from gateway.store.repository import SessionInfo


class CompletionService:
    def __init__(self, core: ServingCore) -> None:
        self.core = core
        self.tokenizer = core.renderer.tokenizer

    async def create(
        self,
        req: CompletionRequest,
        session: SessionInfo,
        *,
        body_hash: str | None = None,
        retry_count: int = 0,
    ) -> dict[str, Any] | StreamingResponse:
        prompts = req.prompts()
        total = len(prompts) * req.n
        if total > self.core.max_n:
            raise APIError(
                422,
                f"{total} choices (prompts x n) is more than this gateway serves in one request ({self.core.max_n}).",
                code="n_too_large",
                param="n",
                retryable=False,
            )
        if req.echo and req.logprobs is not None:
            raise APIError(
                400,
                "echo with logprobs needs prompt logprobs, which this gateway does not compute.",
                code="unsupported",
                param="echo",
                retryable=False,
            )
        rows = await self.core.replay_of(session.id, body_hash, retry_count, total)
        if rows is not None:
            return self._replay(req, rows)

        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        ids = choice_ids("cmpl", total)
        turns = [
            self._turn(req, session, p, stops, ids[k * req.n : (k + 1) * req.n], body_hash)
            for k, p in enumerate(prompts)
        ]
        admission = self.core.admit(total)
        tracked = self.core.track(session.id, body_hash)
        if req.stream:
            return await self._stream(req, turns, admission, tracked)
        with admission, tracked:
            results = await asyncio.gather(
                *(self._one(req, t, k, i) for k, t in enumerate(turns) for i in range(req.n)),
                return_exceptions=True,
            )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        outs: list[ChoiceOutput] = results  # type: ignore[assignment]
        return self._response(req, ids[0], turns, outs)

    def _turn(
        self,
        req: CompletionRequest,
        session: SessionInfo,
        prompt: str | list[int],
        stops: list[str],
        ids: list[str],
        body_hash: str | None,
    ) -> Turn:
        if isinstance(prompt, str):
            prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            vocab = len(self.tokenizer)
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise APIError(
                    400,
                    f"prompt token ids out of range [0, {vocab}): {bad[:5]}",
                    code="invalid_prompt",
                    param="prompt",
                    retryable=False,
                )
            prompt_ids = list(prompt)
        params = self.core.sampling_params(
            len(prompt_ids),
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            top_logprobs=req.logprobs or 0,
            param="prompt",
        )
        return Turn(
            session_id=session.id,
            endpoint="completions",
            model=req.model,
            request=req.model_dump(exclude_none=True),
            prompt_ids=prompt_ids,
            params=params,
            stops=stops,
            parent=None,
            ids=ids,
            request_hash=body_hash,
        )

    async def _one(
        self,
        req: CompletionRequest,
        turn: Turn,
        prompt_index: int,
        i: int,
        stream_to: Any = None,
        cancel: asyncio.Event | None = None,
    ) -> ChoiceOutput:
        out: ChoiceOutput | None = None
        stream = stream_to is not None
        async for item in self.core.generate(turn, i, stream=stream, cancel=cancel):
            if isinstance(item, ChoiceOutput):
                out = item
            elif stream_to is not None and item.text:
                await stream_to(prompt_index * req.n + i, item)
        assert out is not None
        out.index = prompt_index * req.n + i
        answer_hash = hashlib.blake2b(f"{turn.ids[i]}".encode(), digest_size=16).hexdigest()
        await self.core.record(turn, out, {"text": out.text}, out.finish_reason, answer_hash)
        return out

    # ---- shapes ----------------------------------------------------------------------
    def _logprobs(
        self, req: CompletionRequest, ids: list[int], lps: list[float], top: Any, offset: int = 0
    ) -> Logprobs | None:
        if req.logprobs is None:
            return None
        tokens = [self.tokenizer.decode([t]) for t in ids]
        offsets, pos = [], offset
        for piece in tokens:
            offsets.append(pos)
            pos += len(piece)
        top_lp = None
        if req.logprobs and top is not None:
            top_lp = [{self.tokenizer.decode([tid]): lp for tid, lp in alts} for alts in top]
        return Logprobs.model_construct(
            tokens=tokens, token_logprobs=list(lps), top_logprobs=top_lp, text_offset=offsets
        )

    def _choice(
        self, req: CompletionRequest, out: ChoiceOutput, turn: Turn | None, text: str | None = None
    ) -> CompletionChoice:
        body = out.text if text is None else text
        if req.echo and turn is not None and text is None:
            body = self.tokenizer.decode(turn.prompt_ids) + body
        return CompletionChoice.model_construct(
            index=out.index,
            text=body,
            finish_reason=out.finish_reason if out.finish_reason != "abort" else "stop",
            logprobs=self._logprobs(req, out.output_ids, out.logprobs, out.top_logprobs),
        )

    def _response(
        self, req: CompletionRequest, cid: str, turns: list[Turn], outs: list[ChoiceOutput]
    ) -> dict[str, Any]:
        by_prompt = {o.index // req.n for o in outs}
        prompt_tokens = sum(len(turns[k].prompt_ids) for k in by_prompt)
        completion_tokens = sum(len(o.output_ids) for o in outs)
        return Completion.model_construct(
            id=cid,
            object="text_completion",
            created=int(time.time()),
            model=req.model,
            choices=[
                self._choice(req, o, turns[o.index // req.n])
                for o in sorted(outs, key=lambda o: o.index)
            ],
            usage=CompletionUsage.model_construct(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
        ).model_dump(mode="json", exclude_unset=True)

    def _chunk(
        self,
        req: CompletionRequest,
        cid: str,
        index: int,
        text: str,
        finish: str | None,
        lp: Logprobs | None,
    ) -> bytes:
        choice = CompletionChoice.model_construct(
            index=index, text=text, finish_reason=finish, logprobs=lp
        )
        data = Completion.model_construct(
            id=cid,
            object="text_completion",
            created=int(time.time()),
            model=req.model,
            choices=[choice],
        )
        return sse_event(data.model_dump(mode="json", exclude_unset=True))

    def _replay(self, req: CompletionRequest, rows: list[dict[str, Any]]) -> Any:
        outs = [
            ChoiceOutput(
                index=r["choice_index"],
                completion_id=r["id"],
                text=r["response"].get("text", ""),
                output_ids=r["output_ids"],
                logprobs=r["output_logprobs"],
                versions=r["output_versions"],
                top_logprobs=None,
                finish_reason=r["finish_reason"],
            )
            for r in rows
        ]
        prompt_tokens = rows[0]["prompt_tokens"]
        if not req.stream:
            completion_tokens = sum(len(o.output_ids) for o in outs)
            return Completion.model_construct(
                id=rows[0]["id"],
                object="text_completion",
                created=int(time.time()),
                model=req.model,
                choices=[self._choice(req, o, None) for o in outs],
                usage=CompletionUsage.model_construct(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens,
                ),
            ).model_dump(mode="json", exclude_unset=True)

        async def body() -> AsyncIterator[bytes]:
            for o in outs:
                yield self._chunk(req, rows[0]["id"], o.index, o.text, o.finish_reason, None)
            yield SSE_DONE

        return sse_response(body())

    # ---- streaming -------------------------------------------------------------------
    async def _stream(
        self, req: CompletionRequest, turns: list[Turn], admission: Any, tracked: Any
    ) -> StreamingResponse:
        cid = turns[0].ids[0]

        async def produce(queue: Frames, cancel: asyncio.Event) -> None:
            async def emit(index: int, delta: TextDelta) -> None:
                lp = self._logprobs(req, delta.token_ids, delta.logprobs, delta.top_logprobs)
                queue.put_nowait(self._chunk(req, cid, index, delta.text, None, lp))

            try:
                if req.echo:
                    for k, t in enumerate(turns):
                        text = self.tokenizer.decode(t.prompt_ids)
                        for i in range(req.n):
                            queue.put_nowait(self._chunk(req, cid, k * req.n + i, text, None, None))
                outs = await asyncio.gather(
                    *(
                        self._one(req, t, k, i, emit, cancel)
                        for k, t in enumerate(turns)
                        for i in range(req.n)
                    )
                )
                for o in outs:
                    queue.put_nowait(self._chunk(req, cid, o.index, "", o.finish_reason, None))
                if (req.stream_options or {}).get("include_usage"):
                    pt = sum(len(t.prompt_ids) for t in turns)
                    ct = sum(len(o.output_ids) for o in outs)
                    usage = CompletionUsage.model_construct(
                        prompt_tokens=pt, completion_tokens=ct, total_tokens=pt + ct
                    )
                    data = Completion.model_construct(
                        id=cid,
                        object="text_completion",
                        created=int(time.time()),
                        model=req.model,
                        choices=[],
                        usage=usage,
                    )
                    queue.put_nowait(sse_event(data.model_dump(mode="json", exclude_unset=True)))
                queue.put_nowait(SSE_DONE)
            except APIError as exc:
                queue.put_nowait(exc)
            except Exception as exc:  # noqa: BLE001 - reported to the client as an SSE error
                queue.put_nowait(
                    APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
                )
            finally:
                queue.put_nowait(STREAM_END)
                admission.release()
                tracked.done()

        return await self.core.stream_response(produce)
