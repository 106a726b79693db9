"""`GET /v1/models`: the one model this gateway serves, under its served name."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from openai.types import Model

from gateway.state import Session, State

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models")
async def list_models(caller: Session, state: State) -> dict[str, Any]:
    model = Model(
        id=state.config.served_model_name,
        created=int(time.time()),
        object="model",
        owned_by="turnstile",
    )
    return {"object": "list", "data": [model.model_dump()]}
