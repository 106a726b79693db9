"""`POST /v1/responses`: a thin route; the work is in serving.py."""

from gateway.entrypoints.openai.responses.protocol import ResponsesRequest
from gateway.entrypoints.openai.responses.serving import ResponsesServing
from gateway.entrypoints.openai.route import RouteDoc, openai_route

router = openai_route(
    "/responses",
    ResponsesRequest,
    ResponsesServing,
    RouteDoc("openai.types.responses:Response", (404,)),
)
