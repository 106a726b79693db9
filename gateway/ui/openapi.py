"""What the viewer's routes declare in the OpenAPI document.

The document is the contract the fuzzer holds every route to (tests/test_fuzz_api.py),
the viewer's too: its pages answer HTML (the page, the error page, the key form, the
lockout page); a query or path FastAPI cannot parse is a 400 in OpenAI's JSON shape, as
on every route; `metrics.json` answers JSON, its errors in OpenAI's shape.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from gateway.api_schema import RETRY_AFTER, ErrorResponse, errors

_HTML = {"text/html": {"schema": {"type": "string"}}}
_JSON_ERROR = {
    "application/json": {"schema": {"$ref": f"#/components/schemas/{ErrorResponse.__name__}"}}
}


def key_parameters(cookie: str) -> dict[str, Any]:
    """`openapi_extra` for a page: where a browser offers the admin key (routes.py, `_gate`)."""
    return {
        "parameters": [
            {
                "name": "key",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "The admin key, once: moved into a cookie by a redirect.",
            },
            {
                "name": cookie,
                "in": "cookie",
                "required": False,
                "schema": {"type": "string"},
                "description": "The admin key, as the redirect kept it.",
            },
        ]
    }


def page_responses(*not_found: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` of an HTML page (`not_found`: (404,) where it names something)."""
    out: dict[int | str, dict[str, Any]] = {
        303: {"description": "`?key=` given: the same page without it (the key in a cookie)."},
        400: {
            "description": "A filter or parameter it cannot use: the error page (or, "
            "where FastAPI cannot parse it, the JSON error).",
            "content": {**_HTML, **_JSON_ERROR},
        },
        401: {"description": "The key form: no key, or not the admin key.", "content": _HTML},
        429: {
            "description": "Too many invalid keys from this client: the error page.",
            "headers": RETRY_AFTER,
            "content": _HTML,
        },
    }
    for status in not_found:
        out[status] = {"description": "No such session or run: the error page.", "content": _HTML}
    return out


def metrics_responses() -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "description": "The run's metrics and evaluations, by step.",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **errors(400, 401, 404, 429),
    }


def static_responses(files: dict[str, Path]) -> dict[int | str, dict[str, Any]]:
    types = sorted(
        {mimetypes.guess_type(p.name)[0] or "application/octet-stream" for p in files.values()}
    )
    return {
        200: {
            "description": "One of the viewer's fixed files (open to all).",
            "content": {t: {"schema": {"type": "string"}} for t in types},
        },
        404: {
            "description": "Not one of them.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
    }
