"""Tables. Any change here needs a new migration in migrations/versions/."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, LargeBinary, String, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class SessionRow(Base):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    # indexed: every replica asks every few seconds which sessions ended lately (auth.py)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    # sampling settings forced on every request of the session (e.g. greedy evaluation)
    sampling: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # how its turns' prompts are built (template | token_exact); NULL: the gateway's default.
    # The column keeps the option's former name, `history` (no migration)
    prompt_mode: Mapped[str | None] = mapped_column("history", String(16), nullable=True)
    # limits on its requests, generated tokens and concurrency (SessionQuotas); NULL: none
    quotas: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)


class CompletionRow(Base):
    __tablename__ = "completions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # looked up through the two indexes below, which start with it
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    parent_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    endpoint: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    # messages, tools and sampling params as the client sent them; in a delta row, what
    # differs from the parent's (store/delta.py)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    # the assistant message we answered with
    response: Mapped[dict[str, Any]] = mapped_column(JSON)
    # in a delta row, the ids after the first `prompt_shared` (the parent's prompt + output)
    prompt_ids: Mapped[bytes] = mapped_column(LargeBinary)
    # stored as a delta on parent_id's request and prompt (False: stored whole)
    is_delta: Mapped[bool] = mapped_column(default=False)
    prompt_shared: Mapped[int] = mapped_column(Integer, default=0)
    output_ids: Mapped[bytes] = mapped_column(LargeBinary)
    output_logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    output_versions: Mapped[bytes] = mapped_column(LargeBinary)
    finish_reason: Mapped[str] = mapped_column(String(16))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    # hash of (request messages + answer): the key a later turn's prefix is looked up by
    prefix_hash: Mapped[str] = mapped_column(String(64))
    # does this prompt's token sequence start with parent's prompt + output tokens?
    tokens_continue_parent: Mapped[bool | None] = mapped_column(nullable=True)
    queue_s: Mapped[float] = mapped_column(Float, default=0.0)
    gen_s: Mapped[float] = mapped_column(Float, default=0.0)
    total_s: Mapped[float] = mapped_column(Float, default=0.0)
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    reward_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # hash of the request body: a client retry (same body) is answered from these rows
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # which of the request's `n` choices this is (its id is `<choice 0's id>-<index>`)
    choice_index: Mapped[int] = mapped_column(Integer, default=0)
    # a client's side request (title generation, a small model's chore): kept, but left
    # out of training exports unless asked for
    side_request: Mapped[bool] = mapped_column(default=False, server_default=false())
    # not errors, but worth knowing: {"tool_parse_failures": n, "drift": {"at", "cause"}}
    diagnostics: Mapped[dict[str, Any] | None] = mapped_column(
        JSON(none_as_null=True), nullable=True
    )

    __table_args__ = (
        Index("ix_completions_session_prefix", "session_id", "prefix_hash"),
        Index("ix_completions_session_request", "session_id", "request_hash"),
    )


class InflightRow(Base):
    """A request still generating on some replica (only written on a shared store)."""

    __tablename__ = "inflight_requests"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64))
    request_hash: Mapped[str] = mapped_column(String(64))
    # a replica killed mid-request never clears its mark: retries stop waiting here
    expires_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_inflight_session_request", "session_id", "request_hash"),)


class SigningKeyRow(Base):
    """A key the gateway signs with (gateway/signing.py): the newest is current. Kept
    here so that every replica of one store signs and verifies alike."""

    __tablename__ = "signing_keys"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    secret: Mapped[str] = mapped_column(String(128))  # hex
    created_at: Mapped[float] = mapped_column(Float)
