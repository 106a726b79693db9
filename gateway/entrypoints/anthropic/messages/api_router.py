"""`POST /v1/messages` (also with `?beta=true`) and `POST /v1/messages/count_tokens`:
thin routes; the work is in serving.py. Errors under `/v1/messages` answer in
Anthropic's shape (errors.py)."""

from typing import Any

from fastapi import Request

from gateway.entrypoints.anthropic.errors import PREFIX, anthropic_error_response
from gateway.entrypoints.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from gateway.entrypoints.anthropic.messages.serving import MessagesServing
from gateway.entrypoints.openai.route import openai_route, parse_body
from gateway.errors import register_error_shape

register_error_shape(PREFIX, anthropic_error_response)

router = openai_route("/messages", MessagesRequest, MessagesServing, "anthropic")


@router.post("/messages/count_tokens")
async def count_tokens(request: Request) -> dict[str, Any]:
    """The prompt's token count, from the same rendering `/v1/messages` generates from."""
    state = request.app.state.gateway
    caller = state.keys.resolve(request, allow_admin=False)
    body = parse_body(CountTokensRequest, await request.body())
    serving: MessagesServing = state.serving(MessagesServing)
    messages, tools, tool_choice = await serving.chat_of(body, caller.session.id)
    return {"input_tokens": serving.count_tokens(messages, tools, tool_choice)}
