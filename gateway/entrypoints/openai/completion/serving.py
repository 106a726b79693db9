"""Serving `POST /v1/completions`: a raw prompt (text or token ids) in, text out.

No chat template: the prompt's tokens go to the engine as given (token ids exactly,
text tokenised without special tokens added). Each prompt x `n` is one recorded
completion, rewardable by its id; choice `i` of prompt `p` has index `p * n + i`.
Parent links are a chat-messages notion and are not made here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.chat.events import Event
from gateway.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    body,
    choice,
    logprobs,
)
from gateway.entrypoints.openai.protocol import usage
from gateway.errors import APIError
from gateway.serving.endpoint import Choice, Prepared, ServingEndpoint, Stages
from gateway.serving.generate import Sampling
from gateway.serving.turn import (
    Answer,
    ChoiceOutput,
    Prompt,
    TextDelta,
    Turn,
    choice_ids,
    recorded_answer,
)
from gateway.sse import SSE_DONE, sse_event
from gateway.store.repository import SessionInfo


class CompletionChoice(Choice):
    def __init__(self, index: int, p: Prepared, tokenizer: Any) -> None:
        super().__init__(index, None, p.stream)
        self.p, self.tokenizer = p, tokenizer

    def frames(self, events: list[Event], delta: TextDelta | None) -> list[bytes]:
        if delta is None or not delta.text:
            return []
        req: CompletionRequest = self.p.req
        lp = logprobs(self.tokenizer, req, delta.token_ids, delta.logprobs, delta.top_logprobs)
        return [chunk(req, self.p.context["id"], choice(self.index, delta.text, None, lp))]

    def done(self, answer: Answer) -> list[bytes]:
        return [
            chunk(self.p.req, self.p.context["id"], choice(self.index, "", answer.finish_reason))
        ]


class CompletionServing(ServingEndpoint[CompletionRequest]):
    endpoint = "completions"

    def __init__(self, stages: Stages) -> None:
        super().__init__(stages)
        self.tokenizer = self.prompts.renderer.tokenizer

    def validate(self, req: CompletionRequest) -> None:
        if req.echo and req.logprobs is not None:
            raise APIError(
                400,
                "echo with logprobs needs prompt logprobs, which this gateway does not compute.",
                code="unsupported",
                param="echo",
            )

    def num_choices(self, req: CompletionRequest) -> int:
        return len(req.prompts()) * req.n

    async def prepare(self, req: CompletionRequest, session: SessionInfo) -> Prepared:
        ids = choice_ids("cmpl", self.num_choices(req))
        sampling = Sampling(req.max_tokens, req.logprobs or 0, req.stop_strings())
        turns = [
            self.turn(
                req, session, self._prompt(prompt), ids[k * req.n : (k + 1) * req.n], sampling
            )
            for k, prompt in enumerate(req.prompts())
        ]
        return Prepared(req, turns, per_turn=req.n, stream=req.stream, context={"id": ids[0]})

    def _prompt(self, prompt: str | list[int]) -> Prompt:
        """A raw prompt: no chat template, no parent (its ids go to the engine as given)."""
        if isinstance(prompt, str):
            return Prompt(self.tokenizer.encode(prompt, add_special_tokens=False), "prompt")
        vocab = len(self.tokenizer)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise APIError(
                400,
                f"prompt token ids out of range [0, {vocab}): {bad[:5]}",
                code="invalid_prompt",
                param="prompt",
            )
        return Prompt(list(prompt), "prompt")

    def new_choice(self, p: Prepared, turn: Turn, index: int) -> Choice:
        return CompletionChoice(index, p, self.tokenizer)

    def finish(self, p: Prepared, turn: Turn, choice: Choice, out: ChoiceOutput) -> Answer:
        # no parent links here: each completion is only found by its own id
        answer_hash = hashlib.blake2b(out.completion_id.encode(), digest_size=16).hexdigest()
        return Answer(out, out.finish_reason, {"text": out.text}, answer_hash)

    def response(self, p: Prepared, answers: list[Answer]) -> dict[str, Any]:
        outs = sorted((a.out for a in answers), key=lambda o: o.index)
        prompt_tokens = sum(len(t.prompt_ids) for t in p.turns)
        return self._completion(p.req, p.context["id"], outs, self.echoed(p.req, p), prompt_tokens)

    def _completion(
        self,
        req: CompletionRequest,
        cid: str,
        outs: list[ChoiceOutput],
        echoed: list[str],
        prompt_tokens: int,
    ) -> dict[str, Any]:
        """A whole `Completion` (answered, or a retry's again): each text after its echo."""
        choices = []
        for o in outs:
            lp = logprobs(self.tokenizer, req, o.output_ids, o.logprobs, o.top_logprobs)
            choices.append(choice(o.index, echoed[o.index // req.n] + o.text, o.finish_reason, lp))
        completion_tokens = sum(len(o.output_ids) for o in outs)
        return body(req, cid, choices=choices, usage=usage(prompt_tokens, completion_tokens))

    def echoed(self, req: CompletionRequest, p: Prepared | None = None) -> list[str]:
        """What `echo` puts before each prompt's answers: its tokens decoded ("" without
        echo). A retry (no `p`) tokenises its body again: the original's, unchanged."""
        if not req.echo:
            return [""] * len(req.prompts())
        ids = [t.prompt_ids for t in p.turns] if p else [self._prompt(x).ids for x in req.prompts()]
        return [self.tokenizer.decode(i) for i in ids]

    def echo_frames(
        self, req: CompletionRequest, cid: str, p: Prepared | None = None
    ) -> list[bytes]:
        """A stream's first frames with `echo`: each choice's prompt text."""
        if not req.echo:
            return []
        return [
            chunk(req, cid, choice(k * req.n + i, text, None))
            for k, text in enumerate(self.echoed(req, p))
            for i in range(req.n)
        ]

    def stream_start(self, p: Prepared) -> list[bytes]:
        return self.echo_frames(p.req, p.context["id"], p)

    def stream_end(self, p: Prepared, answers: list[Answer]) -> list[bytes]:
        prompt_tokens = sum(len(t.prompt_ids) for t in p.turns)
        completion_tokens = sum(len(a.out.output_ids) for a in answers)
        return closing(p.req, p.context["id"], prompt_tokens, completion_tokens)

    def replay_body(self, req: CompletionRequest, rows: list[dict[str, Any]]) -> Any:
        outs = [recorded_answer(r).out for r in rows]
        return self._completion(
            req, rows[0]["id"], outs, self.echoed(req), replayed_prompt(req, rows)
        )

    def replay_frames(self, req: CompletionRequest, rows: list[dict[str, Any]]) -> list[bytes]:
        cid = rows[0]["id"]
        frames = []
        for o in (recorded_answer(r).out for r in rows):  # each choice whole, in one chunk
            lp = logprobs(self.tokenizer, req, o.output_ids, o.logprobs, o.top_logprobs)
            frames.append(chunk(req, cid, choice(o.index, o.text, o.finish_reason, lp)))
        completion_tokens = sum(len(r["output_ids"]) for r in rows)
        end = closing(req, cid, replayed_prompt(req, rows), completion_tokens)
        return [*self.echo_frames(req, cid), *frames, *end]


def replayed_prompt(req: CompletionRequest, rows: list[dict[str, Any]]) -> int:
    """A retried completion's prompt tokens: each prompt's once (its first choice's)."""
    return sum(r["prompt_tokens"] for r in rows if r["choice_index"] % req.n == 0)


def closing(
    req: CompletionRequest, cid: str, prompt_tokens: int, completion_tokens: int
) -> list[bytes]:
    """A stream's last frames: the usage chunk when `stream_options` asks for it, [DONE]."""
    if not (req.stream_options or {}).get("include_usage"):
        return [SSE_DONE]
    tail = body(req, cid, choices=[], usage=usage(prompt_tokens, completion_tokens))
    return [sse_event(tail), SSE_DONE]


def chunk(req: CompletionRequest, cid: str, one: Any) -> bytes:
    """A stream's chunk of one choice."""
    return sse_event(body(req, cid, choices=[one]))
