"""`POST /v1/chat/completions`: a thin route; the work is in serving.py."""

from gateway.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from gateway.entrypoints.openai.chat_completion.serving import ChatCompletionServing
from gateway.entrypoints.openai.route import RouteDoc, openai_route

router = openai_route(
    "/chat/completions",
    ChatCompletionRequest,
    ChatCompletionServing,
    RouteDoc("openai.types.chat:ChatCompletion"),
)
