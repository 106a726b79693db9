"""What the OpenAPI document promises each route answers, errors included.

The document is a contract that tests hold the gateway to (tests/test_fuzz_api.py runs
schemathesis against it), so every status a route can send is declared here with the
shape it has. FastAPI's own 422 is dropped: the gateway answers a bad body with a 400 in
the OpenAI error shape (gateway/errors.py), never with FastAPI's validation shape; a
422 is only a well-formed request the gateway cannot serve.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

_DESCRIPTIONS = {
    400: "The request is malformed or names something invalid.",
    401: "No key, an unknown key, or an expired session key.",
    403: "A session key where the admin key is needed.",
    404: "No such resource (or it belongs to another session).",
    409: "The resource is not in a state that allows this (e.g. no reward yet).",
    410: "The session has ended; its key no longer generates.",
    413: "The request body is larger than the gateway accepts.",
    422: "Well-formed, but this gateway cannot serve it (e.g. `n` above its limit).",
    429: "Too many requests generating, or a session quota is spent.",
    500: "An unexpected error (a bug); the body never holds a stack trace.",
    503: "The engine or the store is unavailable; retry later.",
    504: "The engine did not answer in time.",
    529: "The gateway is at capacity or its engine is down (Anthropic's `overloaded_error`).",
}
_REF = "#/components/schemas/{model}"
# every route may answer these: the body-size guard and the last-resort handler wrap all
_EVERY_ROUTE = (413, 500)


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape; every non-2xx answer of the gateway has it."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


# routes whose errors have another API's shape (Anthropic's under /v1/messages), by prefix
_ERROR_MODELS: dict[str, type[BaseModel]] = {}


def register_error_model(prefix: str, model: type[BaseModel]) -> None:
    """Declare the error shape of the routes under `prefix` (see errors.register_error_shape)."""
    _ERROR_MODELS[prefix] = model


def error_model(path: str) -> type[BaseModel]:
    return next((m for p, m in _ERROR_MODELS.items() if path.startswith(p)), ErrorResponse)


def errors(*statuses: int, path: str = "") -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries for a route's error statuses (in the shape of `path`'s API)."""
    model = error_model(path)
    return {s: {"model": model, "description": _DESCRIPTIONS[s]} for s in statuses}


def json_200(model: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    """A 200 documented as `model` without FastAPI validating (and re-encoding) the reply."""
    return {200: {"model": model, "description": description}}


def install_openapi(app: FastAPI) -> None:
    """Generate the document once, with the gateway's error shapes in place of FastAPI's."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=None
            )
            app.openapi_schema = _with_gateway_errors(doc)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _with_gateway_errors(doc: dict[str, Any]) -> dict[str, Any]:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for path, ops in doc.get("paths", {}).items():
        model = error_model(path)
        if model.__name__ not in schemas:  # not named by any route's own `responses=`
            schema = model.model_json_schema(ref_template=_REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        error_ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        for op in ops.values():
            responses = op.setdefault("responses", {})
            if "HTTPValidationError" in str(responses.get("422")):  # FastAPI's, not ours
                del responses["422"]
            for status in _EVERY_ROUTE:
                responses.setdefault(
                    str(status),
                    {
                        "description": _DESCRIPTIONS[status],
                        "content": {"application/json": {"schema": error_ref}},
                    },
                )
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc
