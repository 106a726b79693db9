"""New policy weights for this gateway's engine: loaded from a folder, or pushed by a
trainer that did not start this gateway (trainer/backend/weight_push.py) over the
group it joins (weight_broadcast.py). Admin key only. `GET` tells the engine, policy
version, and the device of each rank its engine takes (the trainer picks the group's
backend from them). Left out of /openapi.json: these routes connect to the addresses
they are given and block on a broadcast, which is no request for a fuzzer or an SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from gateway.errors import APIError
from gateway.inference.base import EngineError, WeightUpdate
from gateway.state import Admin, State

if TYPE_CHECKING:  # torch is imported by the first push, not with the app: a gateway
    # behind an external engine loads no torch (#32, item 6; tests/test_model_tokenizer.py)
    from gateway.inference.weight_receiver import WeightReceiver

router = APIRouter(prefix="/admin/weights", tags=["weights"], include_in_schema=False)


class LoadRequest(BaseModel, extra="forbid"):
    version: int = Field(ge=0)
    path: str = Field(min_length=1)


class GroupRequest(BaseModel, extra="forbid"):
    group: dict[str, Any]
    first_rank: int = Field(ge=1)


class PushRequest(BaseModel, extra="forbid"):
    version: int = Field(ge=0)
    group_id: str
    manifest: dict[str, Any]


@dataclass
class _Slot:
    """The engine's receiver and the lock that keeps one group change or push at a time."""

    receiver: WeightReceiver | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _slot(request: Request, state: State) -> tuple[_Slot, WeightReceiver]:
    slot = getattr(request.app.state, "weight_slot", None)
    if slot is None:
        slot = request.app.state.weight_slot = _Slot()
    if slot.receiver is None:
        from gateway.inference.weight_receiver import receiver_for

        try:
            slot.receiver = receiver_for(state.engine)
        except EngineError as exc:
            raise APIError(400, str(exc), code="weight_push_unsupported") from exc
    return slot, slot.receiver


def _failed(exc: Exception) -> APIError:
    return APIError(503, f"weight update failed: {exc}", code="weight_update_failed")


@router.get("")
async def weights_info(request: Request, state: State, _: Admin) -> dict[str, Any]:
    info: dict[str, Any] = {"engine": state.engine.name, "policy_version": state.engine.version}
    try:
        _, receiver = _slot(request, state)
    except APIError:
        return {**info, "ranks": 0, "devices": [], "group_id": None}
    try:
        devices = await receiver.devices()
    except (EngineError, OSError) as exc:
        raise _failed(exc) from exc
    return {
        **info,
        "ranks": len(devices),
        "devices": devices,
        "group_id": receiver.group_id or None,
    }


@router.post("")
async def load_weights(body: LoadRequest, state: State, _: Admin) -> dict[str, Any]:
    try:
        version = await state.engine.update_weights(WeightUpdate(body.version, path=body.path))
    except NotImplementedError as exc:
        raise APIError(400, str(exc), code="weight_load_unsupported") from exc
    except (EngineError, OSError, ValueError) as exc:
        raise _failed(exc) from exc
    return {"policy_version": version}


def _parsed(parse: Any, value: Any, param: str) -> Any:
    """`value` read by `parse`, else a 400 naming the field (invalid_weight_<param>)."""
    try:
        return parse(value)
    except (KeyError, TypeError, ValueError) as exc:
        raise APIError(
            400, f"bad {param}: {exc}", code=f"invalid_weight_{param}", param=param
        ) from exc


@router.post("/group")
async def join_group(
    body: GroupRequest, request: Request, state: State, _: Admin
) -> dict[str, Any]:
    from gateway.inference.weight_broadcast import GroupSpec

    slot, receiver = _slot(request, state)
    spec = _parsed(GroupSpec.from_json, body.group, "group")
    async with slot.lock:
        try:
            await receiver.join(spec, body.first_rank)
        except Exception as exc:  # noqa: BLE001 - any rendezvous failure is the caller's 503
            raise _failed(exc) from exc
    return {"group_id": spec.group_id, "ranks": len(await receiver.devices())}


@router.post("/push")
async def push(body: PushRequest, request: Request, state: State, _: Admin) -> dict[str, Any]:
    from gateway.inference.weight_broadcast import Manifest

    slot, receiver = _slot(request, state)
    manifest = _parsed(Manifest.from_json, body.manifest, "manifest")
    async with slot.lock:
        if not receiver.group_id or receiver.group_id != body.group_id:
            raise APIError(
                409,
                f"this gateway is not in weight group {body.group_id!r} "
                f"(it is in {receiver.group_id or 'none'}): join it first",
                code="weight_group_mismatch",
                param="group_id",
            )
        try:
            version = await receiver.receive(body.version, manifest)
        except Exception as exc:  # noqa: BLE001 - a broken group is the caller's 503
            with contextlib.suppress(Exception):  # its ranks are out of step: join again
                await receiver.leave()
            raise _failed(exc) from exc
    return {"policy_version": version}


@router.delete("/group")
async def leave_group(request: Request, state: State, _: Admin) -> dict[str, Any]:
    slot, receiver = _slot(request, state)
    async with slot.lock:
        await receiver.leave()
    return {"group_id": None}
