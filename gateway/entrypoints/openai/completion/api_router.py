"""`POST /v1/completions`: a thin route; the work is in serving.py."""

from gateway.entrypoints.openai.completion.protocol import CompletionRequest
from gateway.entrypoints.openai.completion.serving import CompletionServing
from gateway.entrypoints.openai.route import RouteDoc, openai_route

router = openai_route(
    "/completions", CompletionRequest, CompletionServing, RouteDoc("openai.types:Completion")
)
