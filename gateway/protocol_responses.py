"""Request body of `POST /v1/responses` (the OpenAI Responses API).

Like the chat request, unknown fields (`store`, `include`, `reasoning`, `text`,
`truncation`, `metadata`, ...) are accepted and ignored. Response bodies use the `openai`
package's own types (see serving_responses.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = "default"
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    stream: bool = False

    @field_validator("input")
    @classmethod
    def _input_not_empty(cls, value: str | list[dict[str, Any]]) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be empty")
        return value
