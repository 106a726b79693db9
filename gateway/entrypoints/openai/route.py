"""The one shape of a generating route: parse the body, check the session key, and hand
the request to its endpoint's serving handler (`OpenAIServing.handle_request`)."""

# No `from __future__ import annotations`: FastAPI reads the body's model from the
# signature, and here that model is a variable.
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gateway.state import Retry, Session, serving_of


def openai_route(path: str, request_model: type, serving_cls: type) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])
    Serving = Annotated[Any, Depends(serving_of(serving_cls))]

    @router.post(path, response_model=None, name=serving_cls.__name__)
    async def route(body: request_model, caller: Session, retry: Retry, serving: Serving) -> Any:  # type: ignore[valid-type]
        reply = await serving.handle_request(body, caller.session, retry)
        if isinstance(reply, dict):  # plain JSON data: encode it once, no jsonable_encoder pass
            return Response(_dumps(reply), media_type="application/json")
        return reply

    return router


def _dumps(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
