"""`POST /v1/messages` (also with `?beta=true`) and `POST /v1/messages/count_tokens`:
thin routes; the work is in serving.py. Errors under `/v1/messages` answer in
Anthropic's shape (errors.py)."""

from typing import Any

from fastapi import Request
from pydantic import BaseModel

from gateway.api_schema import errors
from gateway.entrypoints.anthropic.errors import (
    OVERLOADED,
    PREFIX,
    AnthropicErrorResponse,
    anthropic_error_response,
)
from gateway.entrypoints.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from gateway.entrypoints.anthropic.messages.serving import MessagesServing
from gateway.entrypoints.openai.route import RouteDoc, body_schema, openai_route, parse_body
from gateway.entrypoints.tool_names import check_tool_names
from gateway.errors import register_error_shape

register_error_shape(PREFIX, anthropic_error_response, AnthropicErrorResponse)


class CountTokens(BaseModel):
    input_tokens: int


router = openai_route(
    "/messages",
    MessagesRequest,
    MessagesServing,
    RouteDoc(more_errors=(404, 504, OVERLOADED), tag="anthropic"),
)


@router.post(
    "/messages/count_tokens",
    response_model=None,
    openapi_extra=body_schema(CountTokensRequest),
    responses={
        200: {"model": CountTokens, "description": "The prompt's length in tokens."},
        **errors(400, 401, 410, 504, OVERLOADED, path=PREFIX),
    },
)
async def count_tokens(request: Request) -> dict[str, Any]:
    """The prompt's token count, from the same rendering `/v1/messages` generates from."""
    state = request.app.state.gateway
    caller = await state.keys.resolve(request, allow_admin=False)
    body = parse_body(CountTokensRequest, await request.body())
    check_tool_names(body.tools)
    serving: MessagesServing = state.serving(MessagesServing)
    messages, tools, tool_choice = await serving.chat_of(body, caller.session.id)
    prompt = serving.prompts.render(messages, tools, tool_choice, serving.FIELD)
    return {"input_tokens": len(prompt.ids)}
