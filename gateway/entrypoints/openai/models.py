"""`GET /v1/models`: the one model this gateway serves, under its served name."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel

from gateway.api_schema import errors, json_200
from gateway.state import Session, State

router = APIRouter(prefix="/v1", tags=["openai"])


# OpenAI's model object written out: the SDK's own type costs ~24 MB of imports
# (api_schema.py's deferred schemas)
class Model(BaseModel):
    """A model the gateway serves, in OpenAI's shape."""

    id: str
    created: int
    object: Literal["model"]
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


@router.get(
    "/models",
    response_model=None,
    responses={**json_200(ModelList, "The served model."), **errors(401, 410)},
)
async def list_models(caller: Session, state: State) -> dict[str, Any]:
    model = {
        "id": state.config.served_model_name,
        "created": int(time.time()),
        "object": "model",
        "owned_by": "turnstile",
    }
    return {"object": "list", "data": [model]}
