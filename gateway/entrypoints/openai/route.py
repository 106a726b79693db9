"""The one shape of a generating route: check the session key, parse the body, and hand
the request to its endpoint's serving handler (`ServingEndpoint.handle_request`).

One plain handler, not FastAPI parameters and dependencies: this runs for every agent
turn, and three dependencies plus FastAPI's json-then-validate parsing cost more than the
steps themselves. The body is validated from its bytes once (only where new:
incremental_body.py); errors keep the shapes FastAPI's path gives (an unknown key is 401
before a bad body is 400).
"""

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from gateway import json_codec
from gateway.api_schema import deferred_schema, errors
from gateway.entrypoints.hot_routes import hot
from gateway.entrypoints.tool_names import check_tool_names
from gateway.serving.endpoint import RetryIdentity, ServingEndpoint

# one server-sent event (OpenAPI < 3.2 describes each event of a stream, not the stream)
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
}


@dataclass(frozen=True, slots=True)
class RouteDoc:
    """What a generating route declares in the OpenAPI document beyond its body's schema:
    the type of a whole (non-streamed) answer ("module:Class", imported only for the
    document), the statuses it answers beyond every generating route's, and the tag it is
    listed under."""

    reply_model: str | None = None
    more_errors: tuple[int, ...] = ()
    tag: str = "openai"


def openai_route(
    path: str,
    request_model: type[BaseModel],
    serving_cls: type[ServingEndpoint],
    doc: RouteDoc = RouteDoc(),
) -> APIRouter:
    """`POST /v1<path>`, served by `serving_cls` (any `ServingEndpoint`, whatever its API).
    Its `history_field`, which a session's next body repeats and extends, is parsed only
    where new (incremental_body.py)."""
    router = APIRouter(prefix="/v1", tags=[doc.tag])
    history = serving_cls.history_field
    content: dict[str, Any] = {"text/event-stream": {"schema": _SSE_EVENT}}
    if doc.reply_model:
        content = {"application/json": {"schema": deferred_schema(doc.reply_model)}, **content}
    replies = {
        200: {
            "description": "The answer; with `stream: true`, server-sent events.",
            "content": content,
        },
        **errors(400, 401, 410, 422, 429, 503, *doc.more_errors, path=f"/v1{path}"),
    }

    @router.post(
        path,
        response_model=None,
        name=serving_cls.__name__,
        openapi_extra=body_schema(request_model),
        responses=replies,
    )
    @hot
    async def route(request: Request) -> Response:
        state = request.app.state.gateway
        caller = await state.keys.resolve(request, allow_admin=False)
        raw = await request.body()
        try:
            body, digest = state.bodies.parse(request_model, raw, caller.session.id, history)
        except ValidationError as exc:
            raise invalid_body(exc) from exc
        check_tool_names(getattr(body, "tools", None))
        retry = RetryIdentity(digest, retry_count(request))
        reply = await state.serving(serving_cls).handle_request(body, caller.session, retry)
        if isinstance(reply, Response):  # a stream
            return reply
        # plain JSON data: encoded once, no jsonable_encoder pass
        return Response(json_codec.dumps(reply), media_type="application/json")

    return router


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The `openapi_extra` of a route that parses its body by hand (`parse_body`)."""
    content = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"required": True, "content": content}}


def parse_body(model: type[BaseModel], raw: bytes) -> Any:
    """The request model from the body's bytes; errors as FastAPI reports a bad body."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid_body(exc) from exc


def invalid_body(exc: ValidationError) -> RequestValidationError:
    return RequestValidationError(
        [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_url=False)]
    )


def retry_count(request: Request) -> int:
    """How often an OpenAI SDK has retried this request (its `x-stainless-retry-count`)."""
    try:
        return int(request.headers.get("x-stainless-retry-count", "0"))
    except ValueError:
        return 0
