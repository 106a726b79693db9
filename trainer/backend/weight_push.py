"""Trainer rank 0's side of a weight push: one broadcast to every gateway's engines.

Usage and protocol: docs/scaling.md, "Weights without disk". A push that fails anywhere
closes the group (the next push forms a new one) and raises: a half-pushed policy is
never called done.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import torch

from gateway.inference.remote import normalize_url
from gateway.inference.weight_broadcast import (
    GroupSpec,
    Manifest,
    device_id,
    group_backend,
    host_store,
    open_group,
    send,
)


class WeightPushError(RuntimeError):
    """A gateway refused or failed a push; the group is closed."""


@dataclass(frozen=True)
class PushStats:
    version: int
    tensors: int
    bytes: int
    seconds: float
    join_s: float  # forming the group (first push only)


def gateway_root(url: str) -> str:
    """A gateway's base URL, given with or without its `/v1`."""
    return normalize_url(url).removesuffix("/v1")


def local_address_towards(url: str) -> str:
    """The address of this machine that reaches `url`'s host: where receivers on that
    host can connect back (loopback for a local gateway, the veth or NIC otherwise)."""
    host = urlsplit(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP: nothing is sent, the kernel picks the route
        return s.getsockname()[0]


class WeightPush:
    """Rank 0 of a weight group with the engines of `gateway_urls`."""

    def __init__(
        self,
        gateway_urls: Sequence[str],
        admin_key: str,
        *,
        host: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        """
        gateway_urls: every gateway whose engine gets the weights (with or without /v1).
        admin_key: their admin key.
        host: the address receivers connect to; default: this machine's address
            towards the first gateway.
        timeout_s: how long a rank may wait for the others (joining, each tensor).
        """
        if not gateway_urls:
            raise ValueError("a weight push needs at least one gateway URL")
        self.urls = [gateway_root(u) for u in gateway_urls]
        self.host = host or local_address_towards(self.urls[0])
        self.timeout_s = timeout_s
        self._http = _admin_client(admin_key, httpx.Timeout(timeout_s + 60, connect=10.0))
        self._pool = concurrent.futures.ThreadPoolExecutor(
            len(self.urls) + 1, thread_name_prefix="weight-push"
        )
        self._group: Any = None
        self._spec: GroupSpec | None = None
        self._device: torch.device | None = None
        self._store: Any = None  # rank 0 hosts the group's TCPStore

    # ---- public ----------------------------------------------------------------------
    def push(self, version: int, named_tensors: Mapping[str, torch.Tensor]) -> PushStats:
        """Broadcast the weights to every gateway's engine; returns once all serve
        `version`. Tensors sharing storage (tied embeddings) are sent once."""
        manifest, tensors = Manifest.of(named_tensors)
        device = tensors[0].device if tensors else torch.device("cpu")
        started = time.perf_counter()
        join_s = 0.0
        if self._group is None or self._device != device:
            self._form_group(device)
            join_s = time.perf_counter() - started
        assert self._spec is not None
        body = {"version": version, "group_id": self._spec.group_id, "manifest": manifest.to_json()}
        calls = [self._pool.submit(self._post, u, "/push", body) for u in self.urls]
        self._run_beside(calls, lambda: send(self._group, tensors))
        for url, call in zip(self.urls, calls, strict=True):
            got = call.result().get("policy_version")
            if got != version:
                self.close()
                raise WeightPushError(f"{url} serves version {got} after pushing {version}")
        return PushStats(
            version, len(tensors), manifest.nbytes, time.perf_counter() - started, join_s
        )

    def close(self) -> None:
        """Leave the group (gateways keep serving; the next push forms a new group)."""
        group, self._group = self._group, None
        if group is not None:
            for url in self.urls:
                with contextlib.suppress(httpx.HTTPError):
                    self._http.delete(f"{url}/admin/weights/group")
            group.shutdown()
        self._store = None

    def shutdown(self) -> None:
        self.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def __enter__(self) -> WeightPush:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- the group -------------------------------------------------------------------
    def _form_group(self, device: torch.device) -> None:
        self.close()
        infos = [_answer(u, self._http.get(f"{u}/admin/weights")) for u in self.urls]
        devices = [list(info.get("devices") or []) for info in infos]
        for url, ids in zip(self.urls, devices, strict=True):
            if not ids:
                raise WeightPushError(
                    f"the engine behind {url} takes no weight push: name weight_sync: disk"
                )
        ranks = [len(ids) for ids in devices]
        spec = GroupSpec(
            self.host,
            0,
            1 + sum(ranks),
            group_backend([device_id(device)] + [d for ids in devices for d in ids]),
            group_id=uuid.uuid4().hex[:12],
            timeout_s=self.timeout_s,
        )
        store = host_store(spec)
        spec = dataclasses.replace(spec, port=store.port)
        firsts = itertools.accumulate(ranks[:-1], initial=1)  # rank 0 is this process
        calls = [
            self._pool.submit(self._post, u, "/group", {"group": spec.to_json(), "first_rank": f})
            for u, f in zip(self.urls, firsts, strict=True)
        ]
        groups: list[Any] = []
        self._run_beside(calls, lambda: groups.append(open_group(spec, 0, device, store)))
        self._group, self._spec, self._device, self._store = groups[0], spec, device, store

    def _run_beside(self, calls: list[concurrent.futures.Future[Any]], work: Any) -> None:
        """Run `work` (this rank's part of a collective) while the gateways answer
        `calls`; if a gateway fails first, give up rather than wait out the timeout."""
        mine = self._pool.submit(work)
        pending = {mine, *calls}
        while pending:
            done, pending = concurrent.futures.wait(
                pending, return_when=concurrent.futures.FIRST_EXCEPTION
            )
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                group, self._group = self._group, None
                if group is not None:  # unblocks a broadcast waiting for a rank that left;
                    with contextlib.suppress(RuntimeError):  # else it ends at the timeout
                        group.abort()
                exc = failed.exception()
                raise WeightPushError(f"weight push failed: {exc}") from exc

    def _post(self, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return _answer(url, self._http.post(f"{url}/admin/weights{path}", json=body))


def _admin_client(admin_key: str, timeout: httpx.Timeout | float) -> httpx.Client:
    return httpx.Client(headers={"Authorization": f"Bearer {admin_key}"}, timeout=timeout)


def _answer(url: str, r: httpx.Response) -> dict[str, Any]:
    if r.status_code != 200:
        raise WeightPushError(f"{url}{r.request.url.path} answered {r.status_code}: {r.text}")
    return r.json()


def push_weights(
    gateway_urls: Sequence[str],
    admin_key: str,
    version: int,
    named_tensors: Mapping[str, torch.Tensor],
    **kwargs: Any,
) -> PushStats:
    """One push to every gateway, in a group formed for it and closed after."""
    with WeightPush(gateway_urls, admin_key, **kwargs) as pusher:
        return pusher.push(version, named_tensors)


def load_folder(
    gateway_urls: Sequence[str], admin_key: str, version: int, path: str, timeout_s: float = 1800
) -> None:
    """The disk fallback for gateways the trainer did not start: each loads the Hugging
    Face folder `path` (`POST /admin/weights`), which must be readable where it runs."""
    with _admin_client(admin_key, timeout_s) as http:
        for url in map(gateway_root, gateway_urls):
            _answer(
                url, http.post(f"{url}/admin/weights", json={"version": version, "path": str(path)})
            )
