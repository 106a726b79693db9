"""The built-in actor: samples -> one padded batch -> `engine.train_batch`.

Reads top to bottom like the algorithm: the registered advantage estimator
(`train.advantage`), drop samples that carry no signal, then `train.ppo_n_minibatches`
optimizer updates with the registered loss (`train.loss`), each through the same
`train_batch` call a user's algorithm makes (AReaL's PPO actor does the same). Only positions that predict a
trained token go through the LM head (`logits_mask`). Staleness is measured here,
because only the actor knows which policy version it trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.algorithm.advantages import get_advantage, group_baselines
from trainer.algorithm.losses import get_loss
from trainer.api.config import TrainConfig
from trainer.api.train_engine import LossFn, TrainEngine
from trainer.backend.functional import (
    forward_logits,
    next_token_entropy,
    next_token_logprobs,
    predicting_positions,
)

if TYPE_CHECKING:
    from trainer.rollout.agent_runner import Episode

Batch = dict[str, torch.Tensor]


def to_sequences(episodes: list[Episode]) -> list[Batch]:
    """Every sample of every episode as one dict of tensors: what a training step gets.

    Gateway samples, token workflows and queue agents all end up in this one form (pad
    it with `trainer.backend.pad_sequences`): per token `input_ids`, `loss_mask`,
    `logprobs`, `versions`, `token_returns`; per sequence `returns`, `temperature` and
    `group`; over the numeric keys a workflow returned itself (`Episode.raw`).
    """
    return [
        _sequence(sample, ep.raw[i] if ep.raw else {}, ep.group)
        for ep in episodes
        for i, sample in enumerate(ep.samples)
    ]


def _sequence(sample: dict[str, Any], raw: dict[str, Any], group: int) -> Batch:
    n = len(sample["input_ids"])
    token_returns = sample.get("token_returns") or [float(sample["returns"])] * n
    extra = {  # one value per token or per sequence: anything else cannot be batched
        k: v
        for k, v in raw.items()
        if isinstance(v, torch.Tensor) and (v.dim() == 0 or tuple(v.shape) == (n,))
    }
    return {
        **extra,
        "input_ids": torch.tensor(sample["input_ids"], dtype=torch.long),
        "loss_mask": torch.tensor(sample["loss_mask"], dtype=torch.long),
        "logprobs": torch.tensor(sample["logprobs"], dtype=torch.float32),
        "versions": torch.tensor(sample["versions"], dtype=torch.long),
        "token_returns": torch.tensor(token_returns, dtype=torch.float32),
        "returns": torch.tensor(float(sample["returns"])),
        "temperature": torch.tensor(float(sample.get("temperature", 1.0))),
        "group": torch.tensor(group),
    }


def staleness_stats(batch: Batch, version: int) -> dict[str, float]:
    """How many versions behind the trained policy each generated token was sampled."""
    v = batch["versions"][(batch["loss_mask"] > 0) & (batch["versions"] >= 0)]
    if v.numel() == 0:
        return {}
    lags = (version - v).double()
    return {
        "staleness_mean": float(lags.mean()),
        "staleness_max": float(lags.max()),
        "stale_token_frac": float((lags > 0).double().mean()),
    }


class PPOActor:
    """GRPO / PPO / REINFORCE, or any registered loss and advantage estimator."""

    def __init__(self, engine: TrainEngine, cfg: TrainConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self.advantage = get_advantage(cfg.advantage)
        self.loss = get_loss(cfg.loss)
        # the starting policy, for the KL penalty and the KL signal (logged at kl_coef 0
        # too); an engine that cannot copy itself has no reference and logs no KL
        copy = getattr(engine, "frozen_copy", None)
        self.reference = copy() if copy is not None else None

    def train(self, batch: Batch, version: int) -> dict[str, float]:
        """One optimizer step; `version` is the policy version being trained (pre-step)."""
        mask = batch["loss_mask"] > 0
        advantages = self.advantage(batch, self.cfg).float() * mask
        # samples with zero advantage add nothing to the policy gradient; skip their
        # compute, unless a KL penalty is to pull on them too
        keep = (advantages.abs() > 1e-8).any(dim=1)
        if self.cfg.kl_coef > 0 and self.reference is not None:
            keep = torch.ones_like(keep)
        stats = {
            "num_samples": float(len(keep)),
            "num_trained_samples": float(keep.sum()),
            "zero_spread_frac": zero_spread_share(batch["returns"], batch["group"]),
        }
        batch = {**{k: v[keep] for k, v in batch.items()}, "advantages": advantages[keep]}
        stats.update(staleness_stats(batch, version))
        if not keep.any():
            return stats
        batch["loss_mask"][:, 0] = 0  # nothing predicts a sequence's first token
        batch["logits_mask"] = predicting_positions(batch["loss_mask"])  # the rest: no LM head
        stale = stats.get("staleness_max", 0.0) > 0  # a token sampled by older weights
        stats["prox_recomputed"] = float(stale)
        parts = min(self.cfg.ppo_n_minibatches, int(keep.sum()))
        if stale and parts > 1:
            # every update is measured against the weights the step started from
            batch["prox_logprobs"] = self._logprobs(batch)
        self.engine.train()
        loss_fn = self._loss_fn(stale and parts == 1)
        results = [
            self.engine.train_batch(part, loss_fn, _trained_tokens)
            for part in _split_rows(batch, parts)
        ]
        merged = _merge(results)
        if "logprob_mismatch" in results[0]:  # only the first update runs the sampler's weights
            merged["logprob_mismatch"] = results[0]["logprob_mismatch"]
        return {**stats, **merged, "updates": float(parts)}

    def _logprobs(self, batch: Batch) -> torch.Tensor:
        """(B, L) logprobs of `batch` under the current weights, without gradients."""
        out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)

        def capture(logits: torch.Tensor, mb: Batch) -> torch.Tensor:
            logprobs = next_token_logprobs(logits, mb).detach().cpu()
            # a packed token's row, and its position there (`position_ids`, kept by packing)
            out[mb["row"].cpu(), mb["position_ids"].cpu()] = logprobs
            return logprobs.sum() * 0.0

        self.engine.eval()
        rows = torch.arange(out.shape[0])[:, None].expand(out.shape)  # per token
        self.engine.eval_batch({**batch, "row": rows}, capture, _trained_tokens)
        return out

    def _loss_fn(self, stale: bool) -> LossFn:
        def loss_fn(logits: torch.Tensor, mb: Batch) -> tuple[torch.Tensor, dict[str, float]]:
            logprobs = next_token_logprobs(logits, mb)
            if stale:
                # The proximal policy is the weights at the start of this step, and the
                # step makes one update: they are the weights this pass runs, so their
                # logprobs are these, detached (a second, no-grad pass would give the
                # same numbers). With several updates they were computed beforehand.
                mb = {**mb, "prox_logprobs": logprobs.detach()}
            loss_sum, stats = self.loss(logprobs, mb, self.cfg)
            signals, kl = self._signals(logits, logprobs, mb)
            if self.cfg.kl_coef > 0 and kl is not None:
                loss_sum = loss_sum + self.cfg.kl_coef * kl.sum()
            return loss_sum / mb["loss_mask"].sum().clamp(min=1), {**stats, **signals}

        return loss_fn

    def _signals(
        self, logits: torch.Tensor, logprobs: torch.Tensor, mb: Batch
    ) -> tuple[dict[str, float], torch.Tensor | None]:
        """Per micro-batch, means over its trained tokens of what shows a collapse coming
        (entropy, KL to the start, sampler-vs-trainer mismatch), and the per-token KL
        (k3, with gradient) the penalty adds, or None without a reference."""
        mask = mb["loss_mask"].float()
        n = mask.sum().clamp(min=1)
        with torch.no_grad():
            entropy = next_token_entropy(logits.detach(), mb)
            signals = {
                "entropy": float((entropy * mask).sum() / n),
                "logprob_mismatch": float(
                    ((logprobs.detach() - mb["logprobs"]).abs() * mask).sum() / n
                ),
            }
        if self.reference is None:
            return signals, None
        with torch.no_grad():
            ref = next_token_logprobs(forward_logits(self.reference, mb), mb)
        kl = kl_k3(logprobs, ref) * mask
        signals["kl_ref"] = float(kl.detach().sum() / n)
        return signals, kl


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) by the k3 estimator on tokens sampled from pi:
    exp(r) - r - 1 with r = log pi_ref - log pi. Never negative, unbiased, and its
    gradient pulls log pi towards log pi_ref (Schulman's "Approximating KL"; TRL's GRPO)."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


def zero_spread_share(returns: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose samples all scored the same: they teach nothing, and when it
    nears 1 the run has stopped learning (every answer right, or every answer wrong)."""
    _, scale = group_baselines(returns, groups, "none")  # scale 0: the group is flat
    return len(groups[scale == 0].unique()) / max(1, len(groups.unique()))


# stats of several updates that add up; the others are averaged
_SUMMED = ("trained_tokens", "packed_tokens", "micro_batches", "train_s")


def _split_rows(batch: Batch, parts: int) -> list[Batch]:
    """`parts` (at most the rows) contiguous slices of the rows (advantages were computed
    over whole groups)."""
    chunks = torch.arange(batch["input_ids"].shape[0]).tensor_split(parts)
    return [{k: v[idx] for k, v in batch.items()} for idx in chunks]


def _merge(results: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in results for k in r}
    merged = {}
    for k in keys:
        values = [r[k] for r in results if k in r]
        merged[k] = sum(values) if k in _SUMMED else sum(values) / len(values)
    return merged


def _trained_tokens(mb: Batch) -> torch.Tensor:
    return mb["loss_mask"].sum()
