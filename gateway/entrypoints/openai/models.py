"""`GET /v1/models`: the one model this gateway serves, under its served name."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter
from openai.types import Model
from pydantic import BaseModel

from gateway.api_schema import errors, json_200
from gateway.state import Session, State

router = APIRouter(prefix="/v1", tags=["openai"])


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


@router.get(
    "/models",
    response_model=None,
    responses={**json_200(ModelList, "The served model."), **errors(401, 410)},
)
async def list_models(caller: Session, state: State) -> dict[str, Any]:
    model = Model(
        id=state.config.served_model_name,
        created=int(time.time()),
        object="model",
        owned_by="turnstile",
    )
    return {"object": "list", "data": [model.model_dump()]}
