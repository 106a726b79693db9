"""Request bodies of the OpenAI routes and of our own REST API.

Unknown OpenAI fields (`store`, `metadata`, `user`, ...) are accepted and ignored, as
real agent frameworks send plenty of them. Response bodies use the `openai` package's
own types (see serving_chat.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = "default"
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("messages")
    @classmethod
    def _messages_have_roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(messages):
            role = m.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool", "function"):
                raise ValueError(
                    f"messages[{i}].role must be system/user/assistant/tool, got {role!r}"
                )
        return messages


class CreateSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttl_seconds: float = Field(default=24 * 3600, gt=0, le=30 * 24 * 3600)
    metadata: dict[str, Any] = Field(default_factory=dict)


# Strict: a JSON string such as "0.5" is a client bug, not a reward.
RewardValue = StrictFloat | StrictInt | StrictBool


class RewardRequest(BaseModel):
    """Either one `completion_id` + `reward`, or a `rewards` map of several."""

    model_config = ConfigDict(extra="forbid")

    completion_id: str | None = None
    reward: RewardValue | None = None
    rewards: dict[str, RewardValue] | None = None

    def as_map(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.rewards or {})
        if self.completion_id is not None:
            out[self.completion_id] = self.reward
        return out


class CompletionRequest(BaseModel):
    """`POST /v1/completions`: a prompt as text or token ids (or a list of either)."""

    model_config = ConfigDict(extra="allow")

    model: str = "default"
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, prompt: Any) -> Any:
        if isinstance(prompt, (str, list)) and len(prompt) == 0:
            raise ValueError("prompt must not be empty")
        if isinstance(prompt, list) and any(
            isinstance(p, (str, list)) and len(p) == 0 for p in prompt
        ):
            raise ValueError("prompt must not contain an empty prompt")
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """The prompts of a (possibly batched) request, each text or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]
