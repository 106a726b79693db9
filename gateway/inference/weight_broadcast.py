"""Weights without disk: one process group from trainer rank 0 to every engine
(docs/scaling.md, "Weights without disk": backends, manifest, tied weights).

The group is its own, a `TCPStore` rank 0 hosts, never torch's default group (DeepSpeed's
ranks own that one), so engines on other machines can join a trainer that already runs
distributed. vLLM's worker extension imports this module inside vLLM's venv: torch only.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GroupSpec:
    """Where the group meets: rank 0's store, its size and the backend.

    `group_id` names one group, so a receiver can tell a manifest of its group from
    one of an older group the trainer has since replaced.
    """

    host: str
    port: int
    world_size: int
    backend: str = "gloo"
    group_id: str = ""
    timeout_s: float = 600.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupSpec:
        backend = str(data.get("backend", "gloo"))
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")
        return cls(
            host=str(data["host"]),
            port=int(data["port"]),
            world_size=int(data["world_size"]),
            backend=backend,
            group_id=str(data.get("group_id", "")),
            timeout_s=float(data.get("timeout_s", 600.0)),
        )


@dataclass(frozen=True)
class Manifest:
    """What one push carries, in order: (name, dtype, shape) per tensor sent, and the
    names that are the same tensor as a sent one (`tied`: alias -> sent name)."""

    tensors: list[tuple[str, str, list[int]]]
    tied: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"tensors": [list(t) for t in self.tensors], "tied": dict(self.tied)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        tensors = [(str(n), str(d), [int(s) for s in shape]) for n, d, shape in data["tensors"]]
        for _, dtype, _ in tensors:
            dtype_of(dtype)  # fail before the broadcast starts, not half-way
        return cls(tensors, {str(k): str(v) for k, v in dict(data.get("tied", {})).items()})

    @classmethod
    def of(cls, named: Mapping[str, torch.Tensor]) -> tuple[Manifest, list[torch.Tensor]]:
        """The manifest of a state dict and the tensors to send (tied ones once)."""
        seen: dict[tuple[int, int, tuple[int, ...], torch.dtype], str] = {}
        tensors: list[tuple[str, str, list[int]]] = []
        send: list[torch.Tensor] = []
        tied: dict[str, str] = {}
        for name, t in named.items():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
            if t.numel() and key in seen:
                tied[name] = seen[key]
                continue
            seen[key] = name
            tensors.append((name, str(t.dtype).removeprefix("torch."), list(t.shape)))
            send.append(t)
        return cls(tensors, tied), send

    @property
    def nbytes(self) -> int:
        return sum(dtype_of(d).itemsize * int(torch.Size(s).numel()) for _, d, s in self.tensors)


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def backend_for(device: torch.device | str) -> str:
    """gloo for CPU memory, NCCL for a GPU: the one choice the device makes."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def device_id(device: torch.device | str) -> str:
    """What a rank says its device is: "cpu", or "cuda:<uuid>" for a GPU, the same
    for every process on that card whatever its local index."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    return f"cuda:{torch.cuda.get_device_properties(device).uuid}"


def group_backend(device_ids: list[str]) -> str:
    """The backend for ranks on these devices (`device_id`s, the sender's first): NCCL
    only when each holds a GPU of its own, else gloo."""
    distinct = len(set(device_ids)) == len(device_ids)
    on_gpus = all(d.startswith("cuda:") for d in device_ids)
    return "nccl" if device_ids and on_gpus and distinct else "gloo"


def open_group(
    spec: GroupSpec,
    rank: int,
    device: torch.device | str = "cpu",
    store: dist.Store | None = None,
) -> dist.ProcessGroup:
    """Join the group as `rank`. Blocks until every rank has joined.

    Rank 0 passes the store it hosts (`host_store`); the others connect to it."""
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    if store is None:
        store = dist.TCPStore(
            spec.host, spec.port, spec.world_size, is_master=False, timeout=timeout
        )
    # A fresh key space per group: a store port reused by a later group starts clean.
    store = dist.PrefixStore(f"turnstile-weights/{spec.group_id}", store)
    if spec.backend == "nccl":
        if torch.device(device).type != "cuda":
            raise ValueError("the nccl backend needs a CUDA device for each rank")
        torch.cuda.set_device(torch.device(device))
        # both classes' public (store, rank, size, timeout) constructor
        return dist.ProcessGroupNCCL(store, rank, spec.world_size, timeout)
    return dist.ProcessGroupGloo(store, rank, spec.world_size, timeout)


def host_store(spec: GroupSpec) -> dist.TCPStore:
    """Rank 0's store (spec.port 0: a free port, then read `.port`), made before the
    receivers are told where it is."""
    return dist.TCPStore(
        spec.host,
        spec.port,
        spec.world_size,
        is_master=True,
        timeout=datetime.timedelta(seconds=spec.timeout_s),
        wait_for_workers=False,
    )


def send(group: dist.ProcessGroup, tensors: list[torch.Tensor]) -> None:
    """Rank 0: broadcast each tensor, in the manifest's order."""
    for t in tensors:
        group.broadcast(t.detach().contiguous(), 0).wait()


def receive(
    group: dist.ProcessGroup, manifest: Manifest, device: torch.device | str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """A receiving rank: each tensor as it arrives (name, tensor), tied ones last."""
    received: dict[str, torch.Tensor] = {}
    wanted = set(manifest.tied.values())
    for name, dtype, shape in manifest.tensors:
        t = torch.empty(shape, dtype=dtype_of(dtype), device=device)
        group.broadcast(t, 0).wait()
        if name in wanted:
            received[name] = t
        yield name, t
    for alias, source in manifest.tied.items():
        yield alias, received[source]
