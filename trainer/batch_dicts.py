"""Dict batches for user-written losses: per-sequence dicts -> padded (B, L) -> packed 1-D.

Token-level workflows return one dict of tensors per sequence. The trainer pads them
into one batch with an `attention_mask` (the shape AReaL-style code expects), and
`TrainEngine.train_batch` unpads that batch again into packed micro-batches: every
per-token key becomes one (T,) tensor, sequences sit end to end, and `cu_seqlens`
marks where each starts.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.packing import first_fit


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def pad_sequences(seqs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Per-sequence dicts (per-token values shaped (L,), scalars ()) -> a padded batch.

    A value is per-token when it has the sequence's length; everything else must be a
    scalar per sequence and becomes a (B,) tensor.
    """
    if not seqs:
        raise ValueError("no sequences to batch")
    lengths = [int(_as_tensor(s["input_ids"]).reshape(-1).numel()) for s in seqs]
    width = max(lengths)
    keys = [k for k in seqs[0] if k != "attention_mask"]
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        values = [_as_tensor(s[key]) for s in seqs]
        if all(v.reshape(-1).numel() == n for v, n in zip(values, lengths, strict=True)) and any(
            v.dim() >= 1 for v in values
        ):
            rows = [v.reshape(-1) for v in values]
            padded = torch.zeros((len(seqs), width), dtype=rows[0].dtype)
            for i, row in enumerate(rows):
                padded[i, : row.numel()] = row
            out[key] = padded
        elif all(v.numel() == 1 for v in values):
            out[key] = torch.stack([v.reshape(()) for v in values])
        else:
            raise ValueError(
                f"key {key!r} is neither one value per token nor one per sequence "
                f"(shapes {[tuple(v.shape) for v in values][:4]}, lengths {lengths[:4]})"
            )
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    out["attention_mask"] = mask
    return out


def split_padded(data: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    """A padded batch -> one dict per sequence with padding removed."""
    if "input_ids" not in data or "attention_mask" not in data:
        raise ValueError("train_batch needs `input_ids` and `attention_mask` in the batch")
    mask = _as_tensor(data["attention_mask"]).bool()
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)
    batch, width = mask.shape
    seqs: list[dict[str, torch.Tensor]] = []
    for i in range(batch):
        n = int(mask[i].sum())
        row: dict[str, torch.Tensor] = {}
        for key, value in data.items():
            if key == "attention_mask":
                continue
            v = _as_tensor(value)
            if v.dim() >= 2 and tuple(v.shape[:2]) == (batch, width):
                row[key] = v[i, :n]
            elif v.dim() == 1 and batch == 1 and v.numel() == width:
                row[key] = v[:n]  # a (L,) per-token tensor given without its batch dim
            elif v.dim() >= 1 and v.shape[0] == batch:
                row[key] = v[i]
            else:
                raise ValueError(f"cannot tell how key {key!r} with shape {tuple(v.shape)} aligns")
        seqs.append(row)
    return seqs


def pack_sequences(seqs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Sequences end to end: per-token keys (T,), per-sequence keys (n,), `cu_seqlens`."""
    lengths = [int(s["input_ids"].numel()) for s in seqs]
    out: dict[str, torch.Tensor] = {}
    for key in seqs[0]:
        values = [s[key] for s in seqs]
        if all(v.dim() >= 1 and v.shape[0] == n for v, n in zip(values, lengths, strict=True)):
            out[key] = torch.cat(values)
        else:
            out[key] = torch.stack([v.reshape(()) for v in values])
    out["cu_seqlens"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    out["position_ids"] = torch.cat([torch.arange(n) for n in lengths])
    return out


def micro_batches(
    seqs: list[dict[str, torch.Tensor]], max_tokens: int
) -> list[dict[str, torch.Tensor]]:
    """First-fit by length into packed micro-batches of at most `max_tokens` tokens."""
    bins = first_fit([int(s["input_ids"].numel()) for s in seqs], max_tokens)
    return [pack_sequences([seqs[i] for i in b]) for b in bins]
