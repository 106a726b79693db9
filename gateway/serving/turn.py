"""What one request is to the engine and the store: a `Turn`, and its choices' outputs."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from pydantic import BaseModel

from gateway.chat.linking import ConversationHash, Resume
from gateway.chat.template import Rendered, TextPrefix
from gateway.inference.base import SamplingParams, TopLogprobs
from gateway.store.delta import Full
from gateway.store.records import CompletionRecord


class Parent(NamedTuple):
    """The earlier turn a request continues: its child is stored as a delta on it.

    One this process answered also keeps what its child's work starts from: the text
    its child's render must begin with (incremental prompts) and its conversation hash.
    """

    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    request: dict[str, Any] | None = None  # as recorded (None: unknown; the child is stored whole)
    prefix: TextPrefix | None = None
    conversation: Resume | None = None


class Link(NamedTuple):
    """The parent a request continues, and which of the request's candidate parent
    hashes matched it: its answer is message `answer_positions(messages)[rank]`."""

    parent: Parent
    rank: int


def recorded_request(req: BaseModel, shared: str | None) -> dict[str, Any]:
    """`req.model_dump(exclude_none=True)`, the same keys in the same order, with the
    field `shared` (the history, typed as plain JSON values; None: none) the request's
    own object rather than a copy: a long session's history is held once per turn."""
    out = req.model_dump(exclude_none=True, exclude={shared} if shared else None)
    value = getattr(req, shared) if shared else None
    if value is None:
        return out
    ordered: dict[str, Any] = {}
    for name in type(req).model_fields:  # model_dump's order: the fields, then extras
        if name == shared:
            ordered[name] = value
        elif name in out:
            ordered[name] = out.pop(name)
    ordered.update(out)
    return ordered


def request_hash(body: bytes) -> str:
    """Identity of a request body: a client retry sends the very same bytes."""
    return body_digest(body_hasher(body))


def body_hasher(data: bytes | memoryview = b"") -> Any:
    """The hash `request_hash` takes, fed `data` so far (to resume: `.copy()`, `.update`)."""
    # SHA-256 (first 128 bits): CPUs hash it in hardware, ~2x blake2b on a 140 kB body
    return hashlib.sha256(data)


def body_digest(hasher: Any) -> str:
    return hasher.hexdigest()[:32]


def choice_ids(prefix: str, n: int) -> list[str]:
    """Completion ids of a request's choices: `<prefix>-<hex>`, then `<that>-1`, `-2`, ..."""
    first = f"{prefix}-{secrets.token_hex(16)}"  # 128 random bits, without building a UUID
    return [first] + [f"{first}-{i}" for i in range(1, n)]


@dataclass(slots=True)
class Prompt:
    """A request's prompt as the engine gets it and the record keeps it (stage 1's result,
    serving/prompt.py)."""

    ids: list[int]
    param: str  # the request field it was built from (its errors name it)
    text: str | None = None  # the rendered chat prompt's text, or its end (a windowed render)
    rendered: Rendered | None = None  # the chat prompt's render (the child's TextPrefix)
    parent: Parent | None = None
    conversation: ConversationHash | None = None  # the messages' hash, for the child's
    # does it start with exactly the parent's prompt + output tokens (None: no parent);
    # where it leaves them, and why
    continues: bool | None = None
    drift: dict[str, Any] | None = None
    # `token_exact` sessions: what built it, and why it could not be token_exact
    prompt_mode: str | None = None
    fallback: str | None = None


@dataclass(slots=True)
class Turn:
    """One request, as the engine and the store see it."""

    session_id: str
    endpoint: str
    model: str
    request: dict[str, Any]  # what the client asked for, as recorded
    prompt: Prompt
    params: SamplingParams
    stops: list[str]
    ids: list[str]  # completion id of each choice
    request_hash: str | None = None
    started: float = field(default_factory=time.perf_counter)
    # a client's side request (a title for its UI, a small model's chore): recorded,
    # left out of training exports by default
    side_request: bool = False

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompt.ids

    @property
    def parent(self) -> Parent | None:
        return self.prompt.parent

    def answer_hash(self, message: dict[str, Any]) -> str:
        """The hash a later turn that continues the answer `message` finds it by."""
        if self.prompt.conversation is None:
            raise ValueError("a turn made without messages has no conversation hash")
        return self.prompt.conversation.with_answer(message)

    def force_sampling(self, forced: dict[str, Any]) -> None:
        """The session's own sampling settings win over the request's; the record says
        what was used (its request keeps the client's values under `client_sampling`)."""
        self.params = replace(self.params, **forced)
        asked = {k: self.request.get(k) for k in forced}
        self.request = {**self.request, **forced, "client_sampling": asked}


@dataclass(slots=True)
class TextDelta:
    """Text that became final, and the output tokens behind it (for streamed logprobs)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[TopLogprobs] | None


@dataclass(slots=True)
class ChoiceOutput:
    index: int
    completion_id: str
    text: str  # cut before the stop string, if one was hit
    output_ids: list[int]  # the tokens that produced it (what is recorded)
    logprobs: list[float]
    versions: list[int]
    top_logprobs: list[TopLogprobs] | None
    finish_reason: str  # stop | length | abort (client gone)
    stop_string: str | None = None  # the stop string that ended it, if one did
    queue_s: float = 0.0
    gen_s: float = 0.0


@dataclass(slots=True)
class Answer:
    """A finished choice: what is recorded, and what the reply shapes are built from."""

    out: ChoiceOutput
    finish_reason: str
    response: dict[str, Any]  # the `response` column
    answer_hash: str  # what a later turn continuing this answer is found by
    message: dict[str, Any] | None = None  # the assistant message, where there is one


def completion_record(
    turn: Turn,
    out: ChoiceOutput,
    response: dict[str, Any],
    finish_reason: str,
    prefix_hash: str,
    tool_parse_failures: int = 0,
) -> CompletionRecord:
    """The one place a completion's record is built, for HTTP and direct generations."""
    parent = turn.parent
    found = {
        "drift": turn.prompt.drift,
        "tool_parse_failures": tool_parse_failures,
        "prompt_mode": turn.prompt.prompt_mode,
        "prompt_mode_fallback": turn.prompt.fallback,
    }
    diagnostics = {k: v for k, v in found.items() if v}
    return CompletionRecord(
        id=out.completion_id,
        session_id=turn.session_id,
        endpoint=turn.endpoint,
        model=turn.model,
        request=turn.request,
        response=response,
        prompt_ids=turn.prompt_ids,
        output_ids=out.output_ids,
        output_logprobs=out.logprobs,
        output_versions=out.versions,
        finish_reason=finish_reason,
        prefix_hash=prefix_hash,
        parent_id=parent.id if parent else None,
        tokens_continue_parent=turn.prompt.continues,
        request_hash=turn.request_hash,
        choice_index=out.index,
        side_request=turn.side_request,
        queue_s=out.queue_s,
        gen_s=out.gen_s,
        total_s=time.perf_counter() - turn.started,
        parent=(
            Full(parent.request, parent.prompt_ids, parent.output_ids)
            if parent is not None and parent.request is not None
            else None
        ),
        diagnostics=diagnostics or None,
    )


def recorded_answer(row: dict[str, Any]) -> Answer:
    """A recorded choice as its answer again (a client retry's, serving/endpoint.py)."""
    response = row["response"]
    message = response.get("message")
    out = ChoiceOutput(
        index=row["choice_index"],
        completion_id=row["id"],
        text=response.get("text") or (message or {}).get("content") or "",
        output_ids=row["output_ids"],
        logprobs=row["output_logprobs"],
        versions=row["output_versions"],
        top_logprobs=None,  # (not recorded)
        finish_reason=row["finish_reason"],
    )
    return Answer(out, row["finish_reason"], response, "", message)
