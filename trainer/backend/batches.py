"""The one batch type training sees: per-sequence dicts -> padded (B, L) -> packed 1-D.

Every sample (from the gateway, a token workflow or a queue agent) becomes one dict of
tensors. The trainer pads them into one batch with an `attention_mask` (the shape
AReaL-style code expects), and `TrainEngine.train_batch` unpads that batch again into
packed micro-batches with no padding: every per-token key becomes one (T,) tensor,
sequences sit end to end, `position_ids` restart at 0 for each (which is how the
model's attention keeps them apart) and `cu_seqlens` marks where each starts.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from trainer.backend.prefix_sharing import MIN_SHARED_TOKENS, families, pack_families

# Keys that must be aligned with input_ids when present.
PER_TOKEN_KEYS = ("input_ids", "loss_mask", "logprobs", "versions", "attention_mask")


class SampleError(ValueError):
    """A workflow or agent returned data that cannot be trained on."""


def as_tensor(value: Any) -> torch.Tensor | None:
    """A tensor for numbers / lists of numbers / arrays; None for anything else."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):  # str, bytes, dict, None, ...
        return None


def split_sequences(out: Any) -> list[dict[str, Any]]:
    """A workflow's return value -> one dict per sequence, batch dim and padding removed.

    Per-token entries become (L_i,) tensors, per-sequence numbers 0-d tensors; values
    that are not numeric (strings, nested dicts) are passed through.
    """
    if not hasattr(out, "items"):
        raise SampleError(
            f"expected a dict of tensors (or a TensorDict) or None, got {type(out).__name__}"
        )
    items = dict(out.items())
    if "input_ids" not in items:
        raise SampleError(f"no 'input_ids' in the returned keys {sorted(map(str, items))}")
    ids = as_tensor(items["input_ids"])
    if ids is None or ids.dim() not in (1, 2):
        shape = None if ids is None else tuple(ids.shape)
        raise SampleError(f"input_ids must be a (B, L) or (L,) tensor, got shape {shape}")
    batch, length = (1, ids.shape[0]) if ids.dim() == 1 else (ids.shape[0], ids.shape[1])
    if batch == 0 or length == 0:
        raise SampleError(f"input_ids is empty (shape {tuple(ids.shape)})")

    rows: list[dict[str, Any]] = [{} for _ in range(batch)]
    for key, value in items.items():
        t = as_tensor(value)
        one_each = isinstance(value, list) and batch > 1 and len(value) == batch
        for i, row in enumerate(rows):
            if t is not None:
                row[key] = _row(key, t, i, batch, length)
            else:
                row[key] = value[i] if one_each else value

    for row in rows:
        mask = row.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.shape != (length,) or mask.bool().all():
            continue
        keep = mask.bool()
        for key, value in row.items():
            if isinstance(value, torch.Tensor) and value.shape == (length,):
                row[key] = value[keep]
    return rows


def _row(key: str, t: torch.Tensor, i: int, batch: int, length: int) -> torch.Tensor:
    if t.dim() == 0:
        return t
    if batch == 1:
        if key in PER_TOKEN_KEYS:  # never collapsed to a scalar: its length is checked
            return t[0] if t.dim() == 2 and t.shape[0] == 1 else t
        if t.numel() == length and t.shape[-1] == length:
            return t.reshape(length)  # (L,) or (1, L)
        if t.numel() == 1:
            return t.reshape(())
        return t[0] if t.shape[0] == 1 else t
    if t.shape[0] != batch:
        raise SampleError(
            f"{key} has shape {tuple(t.shape)} but input_ids has {batch} rows; expected "
            f"({batch}, {length}), ({batch},) or a scalar"
        )
    row = t[i]
    return row.reshape(()) if row.numel() == 1 and row.dim() <= 1 else row


def pad_sequences(seqs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Per-sequence dicts (per-token values shaped (L,), scalars ()) -> a padded batch.

    A value is per-token when it has the sequence's length; everything else must be a
    scalar per sequence and becomes a (B,) tensor. Keys some sequences lack are left out.
    """
    if not seqs:
        raise ValueError("no sequences to batch")
    lengths = [int(_numeric(s["input_ids"], "input_ids").reshape(-1).numel()) for s in seqs]
    width = max(lengths)
    keys = [k for k in seqs[0] if k != "attention_mask" and all(k in s for s in seqs)]
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        values = [_numeric(s[key], key) for s in seqs]
        if all(v.reshape(-1).numel() == n for v, n in zip(values, lengths, strict=True)) and any(
            v.dim() >= 1 for v in values
        ):
            rows = [v.reshape(-1).to(values[0].dtype) for v in values]
            out[key] = pad_sequence(rows, batch_first=True)
        elif all(v.numel() == 1 for v in values):
            out[key] = torch.stack([v.reshape(()) for v in values])
        else:
            raise ValueError(
                f"key {key!r} is neither one value per token nor one per sequence "
                f"(shapes {[tuple(v.shape) for v in values][:4]}, lengths {lengths[:4]})"
            )
    out["attention_mask"] = torch.arange(width) < torch.tensor(lengths)[:, None]
    return out


def split_padded(data: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    """A padded batch -> one dict of tensors per sequence with padding removed."""
    if "input_ids" not in data or "attention_mask" not in data:
        raise ValueError("train_batch needs `input_ids` and `attention_mask` in the batch")
    return [
        {k: v for k, v in row.items() if k != "attention_mask" and isinstance(v, torch.Tensor)}
        for row in split_sequences(data)
    ]


def _numeric(value: Any, key: str) -> torch.Tensor:
    t = as_tensor(value)
    if t is None:
        raise ValueError(f"key {key!r} is not numeric ({type(value).__name__}); cannot batch it")
    return t


def micro_batches(
    seqs: list[dict[str, torch.Tensor]], max_tokens: int, share_prefixes: bool = False
) -> list[dict[str, torch.Tensor]]:
    """First-fit by length into packed micro-batches of at most `max_tokens` tokens;
    with `share_prefixes`, sequences sharing an untrained prefix are packed as one
    family (trainer/backend/prefix_sharing.py)."""
    fams = families(seqs, max_tokens, MIN_SHARED_TOKENS if share_prefixes else math.inf)
    bins = first_fit([f.size for f in fams], max_tokens)
    return [pack_families(seqs, [fams[i] for i in b]) for b in bins]


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
