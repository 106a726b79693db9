"""Running token-level workflows (`RolloutWorkflow.arun_episode(engine, data)`, whose
contract and return format are in trainer/api/workflow.py) for the trainer.

`TokenWorkflowRunner` runs the workflow `group_size` times per dataset row and turns each
result into an `Episode` the trainer consumes, exactly like `AgentRunner` does for
OpenAI-style agents. See `sequence_to_sample` for the sample format.
"""

from __future__ import annotations

import copy
import logging
import math
import uuid
from collections.abc import Mapping
from typing import Any

import torch

from trainer.api.io_struct import GenerationHyperparameters
from trainer.api.workflow import RolloutWorkflow
from trainer.backend.batches import PER_TOKEN_KEYS, SampleError, as_tensor, split_sequences
from trainer.rollout.agent_runner import Episode, EpisodeRunner
from trainer.rollout.engine import RolloutEngine

__all__ = [
    "PER_TOKEN_KEYS",
    "SampleError",
    "TokenWorkflowRunner",
    "episode_samples",
    "sequence_to_sample",
    "split_sequences",
    "workflow_temperature",
]

log = logging.getLogger(__name__)


def workflow_temperature(obj: Any) -> float:
    """The sampling temperature of `obj.gconfig` (1.0 when greedy or absent)."""
    gconfig = getattr(obj, "gconfig", None)
    if isinstance(gconfig, dict):
        gconfig = GenerationHyperparameters.coerce(gconfig)
    if isinstance(gconfig, GenerationHyperparameters):
        return gconfig.behaviour_temperature
    return 1.0


# ---- turning returned tensors into samples ------------------------------------------


def sequence_to_sample(
    seq: Mapping[str, Any], *, temperature: float = 1.0, fallback_version: int = -1
) -> dict[str, Any]:
    """Check one sequence and build the sample the trainer packs.

    The sample (python lists, all aligned with input_ids):
        input_ids: list[int]
        loss_mask: list[int]        1 = trained
        logprobs: list[float]       behaviour logprobs, 0.0 where loss_mask is 0
        versions: list[int]         policy version, -1 where loss_mask is 0
        returns: float              the scalar reward (see below); also under "reward"
        temperature: float          logprobs are of logits / temperature
        has_logprobs: bool          False when the workflow gave no logprobs (zeros)

    Rewards: a number, a 0-d / (1,) tensor, or a per-token (L,) tensor; a per-token
    reward is reduced to the value at the LAST trained (loss_mask 1) token, which is
    where an outcome reward sits. Missing versions: `fallback_version` on trained tokens.
    """
    for key in ("input_ids", "loss_mask"):
        if key not in seq:
            raise SampleError(f"no {key!r} in the returned keys {sorted(map(str, seq))}")
    ids = _per_token(seq, "input_ids", None)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise SampleError(f"input_ids must be integers, got dtype {ids.dtype}")
    n = ids.shape[0]
    mask_t = _per_token(seq, "loss_mask", n)
    if not bool(((mask_t == 0) | (mask_t == 1)).all()):
        raise SampleError("loss_mask must hold only 0 and 1")
    mask = mask_t.bool()
    if not bool(mask.any()):
        raise SampleError("loss_mask is all zeros: the sequence has no token to train on")

    has_logprobs = seq.get("logprobs") is not None
    if has_logprobs:
        lp = _per_token(seq, "logprobs", n).double()
        if not bool(torch.isfinite(lp[mask]).all()):
            raise SampleError("logprobs has NaN or inf on a trained token")
        lp = torch.where(mask, lp, 0.0)
    else:
        lp = torch.zeros(n, dtype=torch.float64)
    if seq.get("versions") is not None:
        ver = _per_token(seq, "versions", n).long()
    else:
        ver = torch.full((n,), int(fallback_version), dtype=torch.long)
    ver = torch.where(mask, ver, -1)

    reward = _scalar_reward(seq, mask)
    temp = seq.get("temperature")
    if temp is not None:
        t = as_tensor(temp)
        if t is None or t.numel() != 1 or not math.isfinite(float(t)):
            raise SampleError(f"temperature must be a number, got {temp!r}")
        temperature = float(t)
    temperature = 1.0 if temperature <= 0 else float(temperature)
    return {
        "input_ids": [int(x) for x in ids.tolist()],
        "loss_mask": [int(x) for x in mask.tolist()],
        "logprobs": [float(x) for x in lp.tolist()],
        "versions": [int(x) for x in ver.tolist()],
        "returns": reward,
        "reward": reward,
        "temperature": temperature,
        "has_logprobs": has_logprobs,
    }


def _per_token(seq: Mapping[str, Any], key: str, n: int | None) -> torch.Tensor:
    t = as_tensor(seq[key])
    if t is None or t.dim() != 1:
        shape = None if t is None else tuple(t.shape)
        raise SampleError(f"{key} must be one value per token, got shape {shape}")
    if n is not None and t.shape[0] != n:
        raise SampleError(f"{key} has {t.shape[0]} entries but input_ids has {n} tokens")
    if t.shape[0] == 0:
        raise SampleError(f"{key} is empty")
    return t


def _scalar_reward(seq: Mapping[str, Any], mask: torch.Tensor) -> float:
    key = "rewards" if "rewards" in seq else "reward" if "reward" in seq else None
    if key is None:
        raise SampleError(f"no 'rewards' (or 'reward') in the returned keys {sorted(seq)}")
    value = seq[key]
    t = as_tensor(value)
    if t is None:
        raise SampleError(f"{key} must be a number or a tensor, got {value!r}")
    t = t.double()
    n = mask.shape[0]
    if t.numel() == 1:
        r = float(t.reshape(()))
    elif t.dim() == 1 and t.shape[0] == n:
        if not bool(torch.isfinite(t[mask]).all()):
            raise SampleError(f"{key} has NaN or inf on a trained token")
        last = int(torch.nonzero(mask)[-1])
        r = float(t[last])
    else:
        raise SampleError(
            f"{key} must be a scalar or one value per token ({n}), got shape {tuple(t.shape)}"
        )
    if not math.isfinite(r):
        raise SampleError(f"{key} is {r}: rewards must be finite")
    return r


def episode_samples(
    out: Any, *, temperature: float = 1.0, fallback_version: int = -1
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(samples, raw per-sequence dicts) of one episode's return value."""
    raws = split_sequences(out)
    samples = []
    for i, seq in enumerate(raws):
        try:
            samples.append(
                sequence_to_sample(seq, temperature=temperature, fallback_version=fallback_version)
            )
        except SampleError as exc:
            raise SampleError(f"sequence {i}: {exc}" if len(raws) > 1 else str(exc)) from None
    return samples, raws


# ---- the runner ---------------------------------------------------------------------


class TokenWorkflowRunner(EpisodeRunner):
    """Runs a `RolloutWorkflow` for the trainer: `await run_group(data, group, group_size)`.

    A workflow that raises or returns malformed data yields an Episode with `error` set
    (reported in the metrics, not trained on); it never stops training.
    """

    def __init__(
        self, workflow: RolloutWorkflow, engine: RolloutEngine, max_concurrent: int = 64
    ) -> None:
        if not callable(getattr(workflow, "arun_episode", None)):
            raise TypeError(f"{type(workflow).__name__} has no `async def arun_episode`")
        self.workflow = workflow
        self.engine = engine
        super().__init__(max_concurrent)

    async def run_episode(self, data: dict[str, Any], group: int) -> Episode:
        async with self._sem:
            ep = Episode(group=group, session_id=f"workflow-{uuid.uuid4().hex[:16]}")
            engine = self.engine.fork()
            # recorded in the gateway's store when the trainer gave the engine a recorder
            ep.session_id = await engine.open_episode({"group": group, "kind": "workflow"}) or (
                ep.session_id
            )
            start_version = engine.version
            try:
                out = await self.workflow.arun_episode(engine, copy.deepcopy(data))
            except Exception as exc:  # the workflow's bug must not kill training
                ep.error = f"{type(exc).__name__}: {exc}"
                log.warning("workflow episode %s failed: %s", ep.session_id, ep.error)
                return ep
            finally:
                ep.num_completions = engine.num_requests
                await engine.close_episode()
            if out is None:
                return ep  # the workflow discarded this episode
            try:
                samples, raws = episode_samples(
                    out,
                    temperature=workflow_temperature(self.workflow),
                    fallback_version=start_version,
                )
            except SampleError as exc:
                ep.error = f"malformed arun_episode output: {exc}"
                log.warning("workflow episode %s: %s", ep.session_id, ep.error)
                return ep
            for s in samples:
                s["session_id"] = ep.session_id
            ep.samples, ep.raw = samples, raws
            ep.reward = sum(s["returns"] for s in samples) / len(samples)
            return ep
