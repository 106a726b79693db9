"""Packing variable-length samples into 1-D micro-batches, with no padding.

Sequences sit end to end; `position_ids` restart at 0 for each, which is how the
model's attention mask keeps them apart. Every per-token array is aligned to
`input_ids`: entry j describes token j (its loss mask, behaviour logprob, advantage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (1, T) long
    position_ids: torch.Tensor  # (1, T) long
    loss_mask: torch.Tensor  # (T,) float; 0 for prompt tokens and sequence starts
    old_logprobs: torch.Tensor  # (T,) behaviour-policy logprob of token j
    advantages: torch.Tensor  # (T,)
    versions: torch.Tensor  # (T,) long; -1 where not generated
    num_seqs: int
    temperatures: torch.Tensor | None = None  # (T,) sampling temperature per token
    # (T,) logprobs under the weights at the start of this step (decoupled PPO); None
    # while every token is fresh, because then they equal `old_logprobs`.
    prox_logprobs: torch.Tensor | None = None
    is_padding: bool = False  # an empty stand-in that keeps data-parallel ranks in step

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack(
    samples: list[dict[str, Any]], advantages: list[float | list[float]], max_tokens: int
) -> list[PackedBatch]:
    """Greedy first-fit by length; a sample longer than `max_tokens` gets a batch of its own."""
    if len(samples) != len(advantages):
        raise ValueError("one advantage per sample")
    bins = first_fit([len(s["input_ids"]) for s in samples], max_tokens)
    return [_build(samples, advantages, idx) for idx in bins]


def first_fit(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped into bins of at most `max_tokens` (longest first; oversize alone)."""
    bins: list[list[int]] = []
    sizes: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, size in enumerate(sizes):
            if size + lengths[i] <= max_tokens:
                bins[b].append(i)
                sizes[b] += lengths[i]
                break
        else:
            bins.append([i])
            sizes.append(lengths[i])
    return [sorted(b) for b in bins]


def _build(
    samples: list[dict[str, Any]], advantages: list[float | list[float]], idx: list[int]
) -> PackedBatch:
    ids: list[int] = []
    pos: list[int] = []
    mask: list[float] = []
    old: list[float] = []
    adv: list[float] = []
    ver: list[int] = []
    temp: list[float] = []
    for i in idx:
        s = samples[i]
        n = len(s["input_ids"])
        ids += s["input_ids"]
        pos += range(n)
        m = [float(x) for x in s["loss_mask"]]
        m[0] = 0.0  # nothing predicts a sequence's first token
        mask += m
        old += s["logprobs"]
        a = advantages[i]  # one per sample, or one per token (concat samples)
        adv += list(a) if isinstance(a, (list, tuple)) else [a] * n
        ver += s["versions"]
        temp += [float(s.get("temperature", 1.0))] * n
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        loss_mask=torch.tensor(mask, dtype=torch.float32),
        old_logprobs=torch.tensor(old, dtype=torch.float32),
        advantages=torch.tensor(adv, dtype=torch.float32),
        versions=torch.tensor(ver, dtype=torch.long),
        num_seqs=len(idx),
        temperatures=torch.tensor(temp, dtype=torch.float32),
    )


def padding_batch(token_id: int = 0) -> PackedBatch:
    """Two tokens, one 'trained' with zero advantage: a real forward and backward (so
    ZeRO's collectives line up across ranks) that moves nothing."""
    return PackedBatch(
        input_ids=torch.tensor([[token_id, token_id]]),
        position_ids=torch.tensor([[0, 1]]),
        loss_mask=torch.tensor([0.0, 1.0]),
        old_logprobs=torch.zeros(2),
        advantages=torch.zeros(2),
        versions=torch.full((2,), -1),
        num_seqs=1,
        is_padding=True,
    )


def token_logprobs(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Logprob of every token j under `model` (0 where loss_mask is 0), shape (T,).

    Only positions whose next token is trained are sent through the LM head: the
    prompt tokens' logits are never materialised.
    """
    device = next(model.parameters()).device
    targets = torch.nonzero(batch.loss_mask > 0, as_tuple=True)[0]
    out = torch.zeros(batch.num_tokens, dtype=torch.float32, device=device)
    if targets.numel() == 0:
        return out
    keep = (targets - 1).to(device)
    logits = (
        model(
            input_ids=batch.input_ids.to(device),
            position_ids=batch.position_ids.to(device),
            logits_to_keep=keep,
            use_cache=False,
        )
        .logits[0]
        .float()
    )
    if batch.temperatures is not None:
        # the same distribution the engine sampled from (and recorded logprobs of)
        logits = logits / batch.temperatures[targets].to(device)[:, None]
    tgt_ids = batch.input_ids[0, targets].to(device)
    picked = logits.gather(-1, tgt_ids[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return out.index_put((targets.to(device),), picked)
