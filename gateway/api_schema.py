"""What the OpenAPI document promises each route answers, errors included.

The document is a contract that tests hold the gateway to (tests/test_fuzz_api.py runs
schemathesis against it), so every status a route can send is declared here with the
shape it has. FastAPI's own 422 is dropped: the gateway answers a bad body with a 400 in
the OpenAI error shape (gateway/errors.py), never with FastAPI's validation shape; a
422 is only a well-formed request the gateway cannot serve.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from gateway.errors import registered_shape

_DESCRIPTIONS = {
    400: "The request is malformed or names something invalid.",
    401: "No key, or one that is malformed, unknown or expired (one answer for all).",
    403: "A session key where the admin key is needed.",
    404: "No such resource (or it belongs to another session).",
    409: "The resource is not in a state that allows this (e.g. no reward yet).",
    410: "The session has ended; its key no longer generates.",
    413: "The request body is larger than the gateway accepts.",
    422: "Well-formed, but this gateway cannot serve it (e.g. `n` above its limit).",
    429: (
        "Too many requests generating, a session quota is spent, or too many invalid keys "
        "from this client (then for every route that takes a key, until `Retry-After`)."
    ),
    500: "An unexpected error (a bug); the body never holds a stack trace.",
    503: "The engine or the store is unavailable; retry later.",
    504: "The engine did not answer in time.",
    529: "The gateway is at capacity or its engine is down (Anthropic's `overloaded_error`).",
}
_REF = "#/components/schemas/{model}"
# every route may answer these: the body-size guard and the last-resort handler wrap all
_EVERY_ROUTE = (413, 500)
# a 429's wait, where it has one (the abuse limit on invalid keys always does)
RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer", "minimum": 0},
    }
}


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


def error_model(path: str) -> type[BaseModel]:
    """OpenAI's shape, or the one registered for `path` (errors.register_error_shape)."""
    registered = registered_shape(path)
    return registered[2] if registered is not None else ErrorResponse


def errors(*statuses: int, path: str = "") -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries for a route's error statuses (in the shape of `path`'s API)."""
    model = error_model(path)
    out: dict[int | str, dict[str, Any]] = {
        s: {"model": model, "description": _DESCRIPTIONS[s]} for s in statuses
    }
    if 429 in out:
        out[429]["headers"] = RETRY_AFTER
    return out


def json_200(model: type[BaseModel], description: str) -> dict[int | str, dict[str, Any]]:
    """A 200 documented as `model` without FastAPI validating (and re-encoding) the reply."""
    return {200: {"model": model, "description": description}}


# schemas named by reference and built from their model only when the document is: the
# OpenAI SDK's reply types cost a gateway ~24 MB of RSS it needs for nothing else
_DEFERRED: dict[str, str] = {}


def deferred_schema(target: str) -> dict[str, Any]:
    """A `$ref` to the pydantic model at `target` ("module:Class"), imported only when
    /openapi.json is first built."""
    name = target.rpartition(":")[2]
    if _DEFERRED.setdefault(name, target) != target:
        raise ValueError(f"two deferred schemas named {name}: {_DEFERRED[name]}, {target}")
    return {"$ref": _REF.format(model=name)}


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


def _add_models(schemas: dict[str, Any], models: list[type[BaseModel]]) -> None:
    """`models`' schemas and those they refer to, named as FastAPI names them (two
    classes of one name: by their modules)."""
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
    for name, schema in top.get("$defs", {}).items():
        if schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two schemas named {name} in /openapi.json")


def _with_gateway_errors(doc: dict[str, Any]) -> dict[str, Any]:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    deferred = [t.partition(":") for n, t in _DEFERRED.items() if n not in schemas]
    _add_models(schemas, [getattr(import_module(m), attr) for m, _, attr in deferred])
    for path, ops in doc.get("paths", {}).items():
        model = error_model(path)
        if model.__name__ not in schemas:  # not named by any route's own `responses=`
            _add_models(schemas, [model])
        error = {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}}
        for op in ops.values():
            responses = op.setdefault("responses", {})
            if "HTTPValidationError" in str(responses.get("422")):  # FastAPI's, not ours
                del responses["422"]
            for status in _EVERY_ROUTE:
                responses.setdefault(
                    str(status), {"description": _DESCRIPTIONS[status], "content": error}
                )
            if "{" in path:  # a path value no route matches (a newline): an unknown path's 404
                not_found = responses.setdefault("404", {"description": _DESCRIPTIONS[404]})
                content = not_found.setdefault("content", {})
                content.setdefault("application/json", error["application/json"])
            if "401" in responses:  # it takes a key: the abuse limit may refuse it (auth.py)
                answer = {
                    "description": _DESCRIPTIONS[429],
                    "headers": RETRY_AFTER,
                    "content": error,
                }
                responses.setdefault("429", answer)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc
