"""Data parallelism across trainer ranks (torchrun / the deepspeed launcher).

Rank 0 owns the gateway and the rollouts; every step it broadcasts the batch to all
ranks, and each rank trains on its share of the micro-batches. All ranks must run the
same number of forward/backward passes (ZeRO's collectives pair them up), so shares
are padded with stand-ins that move nothing.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


def rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return rank() == 0


def broadcast_object(obj: Any = None) -> Any:
    """Rank 0's `obj` on every rank (pickled over the process group)."""
    if world_size() == 1:
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def shard(items: list[T], sizes: list[int], rank_: int, world: int) -> list[T | None]:
    """This rank's items, balanced by `sizes`; None pads every rank to the same count."""
    loads = [0] * world
    owned: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(items)), key=lambda i: -sizes[i]):
        # the least-loaded rank among those with the fewest items: counts stay equal
        r = min(range(world), key=lambda r: (len(owned[r]), loads[r]))
        owned[r].append(i)
        loads[r] += sizes[i]
    count = max(len(o) for o in owned)
    mine: list[T | None] = [items[i] for i in sorted(owned[rank_])]
    return mine + [None] * (count - len(mine))
