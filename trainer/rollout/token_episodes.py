"""A token-level episode's return value -> rewards on its recorded generations -> samples,
and the runner of token-level workflows (`TokenWorkflowRunner`).

Token-level workflows (`arun_episode`) and queue agents (`collect_trajectory`) return
their training sequences themselves, but every generation they made is already in the
gateway's store, in the episode's session (gateway/serving/direct.py). Here the returned
sequences become what an HTTP agent's `run` return value becomes: rewards on the
session's completions. Each sequence's reward goes onto the last generation it trains
(as a number returned by `run` goes onto the session's last completion); the generations
no sequence trains (a ReMax greedy baseline) are left out of training exports. The
samples are then the session's export, through `gateway.samples` like every agent's:
`rollout.agent.export_style`, `turn_discount` and the /ui viewer apply to all three
kinds. Tokens, logprobs, versions and temperatures are the recorded ones.

A sequence says which generations it trains: every run of trained tokens (loss_mask 1)
is made of whole outputs of this episode's generations, each right after the very
prompt it was generated from (sequence[:start] == that prompt). A later turn's tokens
follow its earlier turns' (a multi-turn trajectory is prompt, output, feedback, output):
the store links them as parent and child, and `concat` trains them as one sequence again.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gateway.reward_values import finite_reward
from gateway.samples import check_export_style, sampling_temperature
from trainer.api.io_struct import GenerationHyperparameters
from trainer.backend.batches import SampleError, as_tensor, split_sequences
from trainer.rollout.agent_runner import Episode, EpisodeRunner

if TYPE_CHECKING:
    from trainer.api.workflow import RolloutWorkflow
    from trainer.rollout.engine import RolloutEngine

log = logging.getLogger(__name__)

Completion = dict[str, Any]


@dataclass
class Returned:
    """One sequence an episode returned, checked."""

    ids: list[int]
    mask: list[int]
    reward: float
    logprobs: list[float] | None  # only to tell apart generations with the same tokens
    temperature: float | None  # likewise (the logprobs' temperature, when it said)
    raw: dict[str, Any] = field(default_factory=dict)  # as returned, for the batch


def check_sequence(seq: Mapping[str, Any]) -> Returned:
    """The sequence's token ids, trained mask and scalar reward, or a SampleError.

    Rewards: a number, a 0-d / (1,) tensor, or one value per token, of which the value
    at the LAST trained token counts (where an outcome reward sits).
    """
    for key in ("input_ids", "loss_mask"):
        if key not in seq:
            raise SampleError(f"no {key!r} in the returned keys {sorted(map(str, seq))}")
    ids = _per_token(seq, "input_ids", None)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise SampleError(f"input_ids must be integers, got dtype {ids.dtype}")
    n = ids.shape[0]
    mask = _per_token(seq, "loss_mask", n)
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise SampleError("loss_mask must hold only 0 and 1")
    if not bool(mask.bool().any()):
        raise SampleError("loss_mask is all zeros: the sequence has no token to train on")
    logprobs = None
    if seq.get("logprobs") is not None:
        logprobs = [float(x) for x in _per_token(seq, "logprobs", n).double().tolist()]
    temperature = None
    if seq.get("temperature") is not None:
        t = as_tensor(seq["temperature"])
        if t is None or t.numel() != 1 or not math.isfinite(float(t)):
            raise SampleError(f"temperature must be a number, got {seq['temperature']!r}")
        temperature = float(t) if float(t) > 0 else 1.0
    return Returned(
        ids=[int(x) for x in ids.tolist()],
        mask=[int(x) for x in mask.tolist()],
        reward=_scalar_reward(seq, mask.bool()),
        logprobs=logprobs,
        temperature=temperature,
        raw=dict(seq),
    )


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
    t = as_tensor(seq[key])
    if t is None:
        raise SampleError(f"{key} must be a number or a tensor, got {seq[key]!r}")
    t = t.double()
    n = mask.shape[0]
    if t.numel() == 1:
        value = t.reshape(()).item()
    elif t.dim() == 1 and t.shape[0] == n:
        if not bool(torch.isfinite(t[mask]).all()):
            raise SampleError(f"{key} has NaN or inf on a trained token")
        value = t[int(torch.nonzero(mask)[-1])].item()
    else:
        raise SampleError(
            f"{key} must be a scalar or one value per token ({n}), got shape {tuple(t.shape)}"
        )
    reward = finite_reward(value)
    if reward is None:
        raise SampleError(f"{key} is {value}: rewards must be finite")
    return reward


def returned_sequences(out: Any) -> list[Returned]:
    """A workflow's return value (a dict of (B, L) tensors) as checked sequences."""
    seqs = split_sequences(out)
    checked = []
    for i, seq in enumerate(seqs):
        try:
            checked.append(check_sequence(seq))
        except SampleError as exc:
            raise SampleError(f"sequence {i}: {exc}" if len(seqs) > 1 else str(exc)) from None
    return checked


# ---- which recorded generations a sequence trains ----------------------------------


def _trained_runs(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _slots(seq: Returned, by_start: dict[int, list[Completion]]) -> list[tuple[int, list]]:
    """(start, the generations whose output the sequence holds there) in token order."""
    ids, slots = seq.ids, []
    for a, b in _trained_runs(seq.mask):
        p = a
        while p < b:
            fits = [
                c
                for c in by_start.get(p, ())
                if p + len(c["output_ids"]) <= b
                and ids[p : p + len(c["output_ids"])] == c["output_ids"]
                and ids[:p] == c["prompt_ids"]
            ]
            if not fits:
                raise SampleError(
                    f"trained tokens {p}..{b - 1} are not the output of a generation of this "
                    "episode after the tokens before them: a sequence trains whole outputs "
                    "that the engine gave, each after the exact prompt it was given"
                )
            longest = max(len(c["output_ids"]) for c in fits)
            slots.append((p, [c for c in fits if len(c["output_ids"]) == longest]))
            p += longest
    return slots


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-4 for x, y in zip(a, b, strict=True))


def trained_chain(
    seq: Returned,
    by_start: dict[int, list[Completion]],
    leaves: set[str],
    parents: set[str],
    temperature: float | None,
) -> list[Completion]:
    """The generations `seq` trains, first to last. Where several recorded generations
    hold the same tokens (n samples that answered alike), the chain follows the store's
    parent links; it ends on a generation without children that no other sequence ended
    with; then the sampling temperature and logprobs the sequence gave decide, and a
    sampled one goes before a greedy one."""
    temperature = seq.temperature if seq.temperature is not None else temperature
    chain: list[Completion] = []
    child: Completion | None = None
    for start, fits in reversed(_slots(seq, by_start)):
        lps = seq.logprobs[start:] if seq.logprobs is not None else None

        def rank(c: Completion, child: Completion | None = child, lps: Any = lps) -> tuple:
            return (
                child is not None and child["parent_id"] != c["id"],
                child is None and c["id"] in parents,
                child is None and c["id"] in leaves,
                temperature is not None and sampling_temperature(c) != temperature,
                lps is not None and not _close(lps[: len(c["output_ids"])], c["output_logprobs"]),
                not (c.get("request") or {}).get("temperature"),  # greedy last
                c["created_at"],
                c["id"],
            )

        child = min(fits, key=rank)
        chain.append(child)
    return chain[::-1]


def settle(
    seqs: list[Returned], completions: list[Completion], temperature: float | None
) -> tuple[dict[str, float], list[str]]:
    """Each sequence's reward onto the last generation it trains (see module doc): the
    rewards by completion id, one per sequence in its order, and the generations left out
    of training."""
    by_start: dict[int, list[Completion]] = {}
    for c in completions:
        if c["output_ids"]:
            by_start.setdefault(len(c["prompt_ids"]), []).append(c)
    parents = {c["parent_id"] for c in completions if c["parent_id"]}
    rewards: dict[str, float] = {}
    used: set[str] = set()
    ended_by: dict[str, int] = {}
    for i, seq in enumerate(seqs):
        try:
            chain = trained_chain(seq, by_start, set(ended_by), parents, temperature)
        except SampleError as exc:
            raise SampleError(f"sequence {i}: {exc}" if len(seqs) > 1 else str(exc)) from None
        leaf = chain[-1]["id"]
        if leaf in ended_by:
            raise SampleError(
                f"sequences {ended_by[leaf]} and {i} end with the same generation: each "
                "returned sequence's last trained output must be a generation of its own"
            )
        ended_by[leaf] = i
        rewards[leaf] = seq.reward
        used.update(c["id"] for c in chain)
    return rewards, [c["id"] for c in completions if c["id"] not in used]


# ---- the runner both token-level agent kinds share -----------------------------------


class RecordedEpisodeRunner(EpisodeRunner):
    """Runs token-level episodes for the trainer, each in a session of its own in the
    gateway's store; subclasses say how an episode is played (`play`) and what it
    returned (`sequences`). An episode that raises or returns malformed data gets
    `error` set (reported in the metrics, not trained on); it never stops training."""

    kind = "token"  # the session's `kind` metadata
    malformed = "malformed output"  # how a SampleError is reported

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        export_style: str = "individual",
        turn_discount: float = 1.0,
        max_concurrent: int = 64,
    ) -> None:
        if engine.recorder is None:
            raise ValueError(
                "token-level episodes are recorded in the gateway's store and trained from "
                "it: build the engine with RolloutEngine.for_gateway(gateway)"
            )
        check_export_style(export_style)
        self.engine = engine
        self.export_style = export_style
        self.turn_discount = turn_discount
        super().__init__(max_concurrent)

    async def play(self, engine: RolloutEngine, data: dict[str, Any]) -> tuple[Any, float | None]:
        """Run the user's code: (what it returned, the temperature it sampled at if known)."""
        raise NotImplementedError

    def sequences(self, out: Any) -> list[Returned] | None:
        """What `play` returned, checked (None: the episode is discarded)."""
        raise NotImplementedError

    async def _samples(self, ep: Episode, seqs: list[Returned], temperature: float | None) -> None:
        """Rewards into the episode's session, then its samples from the store, into `ep`.

        `ep.raw[i]` holds what the episode returned for `ep.samples[i]` where that sample
        is one returned sequence token for token (its other numeric keys join the training
        batch); {} where the export style made the sample otherwise."""
        recorder = self.engine.recorder
        assert recorder is not None
        rewards, untrained = settle(seqs, await recorder.completions(ep.session_id), temperature)
        await recorder.settle(ep.session_id, rewards, untrained)
        if seqs:
            ep.reward = sum(s.reward for s in seqs) / len(seqs)
        samples = await recorder.export(ep.session_id, self.export_style, self.turn_discount)
        # `rewards` holds each sequence's last trained generation, in the sequences' order
        returned = {
            (leaf, tuple(seq.ids)): seq.raw for seq, leaf in zip(seqs, rewards, strict=True)
        }
        ep.samples = [s.to_dict() for s in samples]
        ep.raw = [returned.get((s.completion_ids[-1], tuple(s.input_ids)), {}) for s in samples]

    async def run_episode(self, data: dict[str, Any], group: int) -> Episode:
        async with self._sem:
            engine = self.engine.fork()
            session_id = await engine.open_episode({"group": group, "kind": self.kind})
            ep = Episode(group=group, session_id=session_id)
            try:
                out, temperature = await self.play(engine, copy.deepcopy(data))
                seqs = self.sequences(out)
                if seqs is not None:
                    await self._samples(ep, seqs, temperature)
            except SampleError as exc:
                ep.error = f"{self.malformed}: {exc}"
            except Exception as exc:  # the user's bug must not kill training
                ep.error = f"{type(exc).__name__}: {exc}"
            finally:
                ep.num_completions = engine.num_requests
                await engine.close_episode()
            if ep.error:
                ep.samples, ep.raw = [], []
                log.warning("%s episode %s failed: %s", self.kind, session_id, ep.error)
            return ep


class TokenWorkflowRunner(RecordedEpisodeRunner):
    """Runs a `RolloutWorkflow` (trainer/api/workflow.py) for the trainer: `await
    run_group(data, group, group_size)`, each run in a session of its own."""

    kind = "workflow"
    malformed = "malformed arun_episode output"

    def __init__(self, workflow: RolloutWorkflow, engine: RolloutEngine, **kwargs: Any) -> None:
        """`kwargs`: `export_style`, `turn_discount`, `max_concurrent`."""
        if not callable(getattr(workflow, "arun_episode", None)):
            raise TypeError(f"{type(workflow).__name__} has no `async def arun_episode`")
        self.workflow = workflow
        super().__init__(engine, **kwargs)

    async def play(self, engine: RolloutEngine, data: dict[str, Any]) -> tuple[Any, float | None]:
        """What `arun_episode` returned, and the temperature of the workflow's `gconfig`
        (1.0 when greedy; None without one)."""
        out = await self.workflow.arun_episode(engine, data)
        gconfig = getattr(self.workflow, "gconfig", None)
        if isinstance(gconfig, dict):
            gconfig = GenerationHyperparameters.coerce(gconfig)
        if isinstance(gconfig, GenerationHyperparameters):
            return out, gconfig.behaviour_temperature
        return out, None

    def sequences(self, out: Any) -> list[Returned] | None:
        return None if out is None else returned_sequences(out)
