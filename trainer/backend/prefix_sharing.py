"""Packing sequences that share a prompt: the shared tokens are run through the model once.

Most of a step's packed tokens are prompts the loss never trains (a GRPO group's runs, a
session's earlier turns; docs/training.md, step 4). A sequence that shares another's
untrained prefix keeps its tokens from the last shared one on, at their original
positions, and reads the other's copy through the attention mask `prefix_mask` ((1, 1,
T, T)): the same keys at the same positions, so the same logits and gradients. `offset`
(per sequence) counts the leading tokens left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Below this many shared tokens a sequence is packed in full: sharing saves little.
MIN_SHARED_TOKENS = 16


@dataclass
class Family:
    """One sequence packed in full and the ones that read its prefix: (index, shared)."""

    owner: int
    members: list[tuple[int, int]] = field(default_factory=list)
    size: int = 0  # packed tokens


def shared_prefix(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> int:
    """Leading tokens `a` and `b` have in common and neither trains."""
    ids_a, ids_b = a["input_ids"], b["input_ids"]
    n = min(ids_a.numel(), ids_b.numel())
    differ = (ids_a[:n] != ids_b[:n]) | (a["loss_mask"][:n] > 0) | (b["loss_mask"][:n] > 0)
    hits = torch.nonzero(differ, as_tuple=True)[0]
    return int(hits[0]) if hits.numel() else n


def families(
    seqs: list[dict[str, torch.Tensor]], max_tokens: int, min_shared: float = MIN_SHARED_TOKENS
) -> list[Family]:
    """Each sequence joins the family whose owner shares the longest prefix with it
    (at least `min_shared` tokens, and the family stays within `max_tokens`), or
    starts its own (every sequence does with `min_shared` inf)."""
    out: list[Family] = []
    for i, seq in enumerate(seqs):
        length = int(seq["input_ids"].numel())
        best, best_shared, best_kept = None, 0, 0
        if "loss_mask" in seq and length >= min_shared:
            for fam in out:
                shared = shared_prefix(seqs[fam.owner], seq)
                kept = length - shared + 1  # its own tokens and the last shared one
                if shared > best_shared and shared >= min_shared and fam.size + kept <= max_tokens:
                    best, best_shared, best_kept = fam, shared, kept
        if best is None:
            out.append(Family(i, [(i, 0)], length))
        else:
            best.members.append((i, best_shared))
            best.size += best_kept
    return out


def pack_families(
    seqs: list[dict[str, torch.Tensor]], fams: list[Family]
) -> dict[str, torch.Tensor]:
    """The families' sequences end to end, each one's shared prefix left out but the
    last shared token (its logits predict the sequence's first own token)."""
    parts: list[dict[str, torch.Tensor]] = []
    spans: list[tuple[int, int, int, int]] = []  # (start, end, owner start, tokens left out)
    cursor = 0
    for fam in fams:
        owner_start = cursor
        for index, shared in fam.members:
            seq = seqs[index]
            length = int(seq["input_ids"].numel())
            skip = max(shared - 1, 0)
            part = {
                k: (v[skip:] if v.dim() >= 1 and v.shape[0] == length else v)
                for k, v in seq.items()
            }
            part["position_ids"] = torch.arange(skip, length)
            parts.append(part)
            spans.append((cursor, cursor + length - skip, owner_start, skip))
            cursor += length - skip
    out: dict[str, torch.Tensor] = {}
    lengths = [int(p["input_ids"].numel()) for p in parts]
    for key in parts[0]:
        values = [p[key] for p in parts]
        if all(v.dim() >= 1 and v.shape[0] == n for v, n in zip(values, lengths, strict=True)):
            out[key] = torch.cat(values)
        else:
            out[key] = torch.stack([v.reshape(()) for v in values])
    out["cu_seqlens"] = torch.tensor([*(span[0] for span in spans), cursor])
    offsets = [span[3] for span in spans]
    if any(offsets):
        causal = (torch.ones((e - s, e - s), dtype=torch.bool).tril() for s, e, _, _ in spans)
        mask = torch.block_diag(*causal)  # each sequence sees itself, causally...
        for start, end, owner_start, seen in spans:  # ...and the prefix it left out
            mask[start:end, owner_start : owner_start + seen] = True
        out["prefix_mask"] = mask[None, None]
        out["offset"] = torch.tensor(offsets)
    return out
