"""How fast is this machine today? A short timed forward+backward of the policy.

Machines of one kind differ 2-3x in speed from day to day, so a run's length is
estimated before it starts: the probe's time against the same probe on a reference
machine scales that machine's measured step and evaluation times (`time_estimate` in
the config).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def probe_seconds(model: torch.nn.Module, tokens: int = 256, repeats: int = 2) -> float:
    """Seconds for one forward+backward over `tokens` tokens (best of `repeats`, after a
    warm-up). Gradients are taken with autograd.grad, so nothing accumulates in .grad
    and the training state is untouched."""
    vocab = int(model.get_input_embeddings().weight.shape[0])
    first = model.get_input_embeddings().weight
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0))
    ids = ids.to(first.device)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        logits = model(input_ids=ids, use_cache=False).logits
        torch.autograd.grad(logits.float().logsumexp(-1).mean(), [first])
        times.append(time.perf_counter() - started)
    return min(times[1:])


@dataclass
class Estimate:
    slowdown: float  # this machine's probe time / the reference machine's
    step_s: float
    eval_s: float

    def total_s(self, steps: int, evals: int) -> float:
        return steps * self.step_s + evals * self.eval_s


def estimate(probe_s: float, reference: dict[str, float]) -> Estimate | None:
    """Scale the reference machine's step and eval times by the probe ratio."""
    if not reference.get("probe_s"):
        return None
    slowdown = probe_s / reference["probe_s"]
    return Estimate(
        slowdown,
        slowdown * float(reference.get("step_s", 0.0)),
        slowdown * float(reference.get("eval_s", 0.0)),
    )
