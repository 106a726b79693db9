"""Shapes of the session and reward routes: request bodies, and the replies as the
OpenAPI document declares them (the routes build plain dicts; tests/test_fuzz_api.py
holds every reply to these shapes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from gateway.samples.sample import Sample


class SessionSampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)


class SessionQuotas(BaseModel):
    """Optional per-session limits; a request past one gets a 429 (`quota_exceeded`)."""

    model_config = ConfigDict(extra="forbid")

    max_requests: int | None = Field(default=None, ge=1, description="generating requests")
    max_generated_tokens: int | None = Field(
        default=None, ge=1, description="output tokens over all its completions"
    )
    max_concurrent_requests: int | None = Field(
        default=None, ge=1, description="generating requests in flight at once"
    )


class CreateSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttl_seconds: float = Field(default=24 * 3600, gt=0, le=30 * 24 * 3600)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # forced on every request of the session, whatever the agent asks (e.g. greedy eval)
    sampling: SessionSampling | None = None
    # how its turns' prompts are built (see GatewayConfig.prompt_mode); none: the
    # gateway's. `history`, its former name, is still read
    prompt_mode: Literal["template", "token_exact"] | None = Field(
        default=None, validation_alias=AliasChoices("prompt_mode", "history")
    )
    quotas: SessionQuotas | None = None


class QuotaUsage(BaseModel):
    """A session's quotas (null: no limit) and what it has used of them."""

    max_requests: int | None
    max_generated_tokens: int | None
    max_concurrent_requests: int | None
    requests: int
    generated_tokens: int
    concurrent_requests: int


class SessionView(BaseModel):
    id: str
    created_at: float
    expires_at: float
    ended_at: float | None
    status: Literal["active", "ended", "expired"]
    metadata: dict[str, Any]
    sampling: dict[str, Any] | None
    prompt_mode: str | None
    quotas: QuotaUsage


class CreatedSession(SessionView):
    api_key: str = Field(description="the session's own key; shown only here")


class SessionSummary(BaseModel):
    id: str
    created_at: float
    expires_at: float
    ended_at: float | None
    metadata: dict[str, Any]
    num_completions: int
    num_rewarded: int


class SessionList(BaseModel):
    object: Literal["list"]
    data: list[SessionSummary]


class Timings(BaseModel):
    queue_s: float
    gen_s: float
    total_s: float


class CompletionView(BaseModel):
    """One recorded completion, token arrays decoded (store/repository.completion_dict)."""

    id: str
    session_id: str
    parent_id: str | None
    created_at: float
    endpoint: str
    model: str
    request: dict[str, Any]
    response: dict[str, Any]
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    tokens_continue_parent: bool | None
    timings: Timings
    reward: float | None
    choice_index: int
    diagnostics: dict[str, Any]


class SessionStats(BaseModel):
    num_completions: int
    num_rewarded: int
    token_prefix_mismatches: int
    drift_causes: dict[str, int]
    tool_parse_failures: int


class SessionDetail(SessionView):
    completions: list[CompletionView]
    stats: SessionStats


class SessionExport(BaseModel):
    session_id: str
    style: str
    turn_discount: float
    samples: list[Sample]


class RewardSet(BaseModel):
    completion_id: str
    reward: float


class RewardList(BaseModel):
    object: Literal["list"]
    data: list[RewardSet]
