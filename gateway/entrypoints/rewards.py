"""Rewards, keyed by completion id. Setting the same reward twice is harmless."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt

from gateway.api_schema import errors, json_200
from gateway.auth import Caller
from gateway.entrypoints.session_protocol import RewardList
from gateway.errors import APIError, check_finite
from gateway.state import AnyCaller, GatewayState, State

router = APIRouter(prefix="/v1", tags=["rewards"])

# Strict: a JSON string such as "0.5" is a client bug, not a reward.
RewardValue = StrictFloat | StrictInt | StrictBool


class RewardRequest(BaseModel):
    """Either one `completion_id` + `reward`, or a `rewards` map of several."""

    model_config = ConfigDict(extra="forbid")

    completion_id: str | None = None
    reward: RewardValue | None = None
    rewards: dict[str, RewardValue] | None = None

    def as_map(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.rewards or {})
        if self.completion_id is not None:
            out[self.completion_id] = self.reward
        return out


async def _apply(state: GatewayState, caller: Caller, rewards: dict[str, Any]) -> dict[str, Any]:
    if not rewards:
        raise APIError(
            400,
            "Give `completion_id` and `reward`, or a `rewards` map.",
            code="invalid_reward",
            param="rewards",
        )
    clean = {cid: check_finite(value, f"rewards[{cid}]") for cid, value in rewards.items()}
    owners = await run_in_threadpool(state.repo.completion_owner, list(clean))
    for cid in clean:
        owner = owners.get(cid)
        if owner is None or not caller.may_touch(owner):
            raise APIError(
                404,
                f"No completion {cid!r}.",
                code="completion_not_found",
                param="completion_id",
            )
    await run_in_threadpool(state.repo.set_rewards, clean)
    state.metrics.inc("turnstile_rewards_total", len(clean))
    return {
        "object": "list",
        "data": [{"completion_id": cid, "reward": v} for cid, v in clean.items()],
    }


_REPLIES = {**json_200(RewardList, "The rewards as stored."), **errors(400, 401, 404)}


@router.post("/rewards", response_model=None, responses=_REPLIES)
async def set_rewards(body: RewardRequest, state: State, caller: AnyCaller) -> dict[str, Any]:
    if body.completion_id is not None and body.reward is None:
        raise APIError(
            400, "`reward` is required with `completion_id`.", code="invalid_reward", param="reward"
        )
    return await _apply(state, caller, body.as_map())


@router.put("/completions/{completion_id}/reward", response_model=None, responses=_REPLIES)
async def put_reward(
    completion_id: str,
    state: State,
    caller: AnyCaller,
    reward: Annotated[RewardValue, Body(embed=True)],
) -> dict[str, Any]:
    return await _apply(state, caller, {completion_id: reward})
