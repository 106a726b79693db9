"""A pytest plugin that breaks the trainer on purpose, to show that tests/test_learning.py
catches a broken trainer (#30). Not loaded by default:

    TURNSTILE_MUTATION=flip_advantage .venv/bin/pytest -p tests.mutations tests/test_learning.py

must FAIL, for each of:
- `flip_advantage`: every advantage's sign flipped (the policy learns the opposite);
- `shift_logprobs`: the trainer's logprobs read one token off (an off-by-one in packing);
- `skip_weight_push`: new weights never reach the inference engine (the version still
  goes up, so nothing but learning shows it).
`python -m bench.mutations` runs all three and the unbroken test.
"""

from __future__ import annotations

import os

import torch

MUTATIONS = ("flip_advantage", "shift_logprobs", "skip_weight_push")


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    mutation = os.environ.get("TURNSTILE_MUTATION")
    if not mutation:
        return
    if mutation not in MUTATIONS:
        raise ValueError(f"TURNSTILE_MUTATION must be one of {MUTATIONS}, got {mutation!r}")
    from trainer import trainer as trainer_module
    from trainer.algorithm import actor

    if mutation == "flip_advantage":
        original = actor.get_advantage

        def flipped(name):
            estimator = original(name)
            return lambda batch, cfg: -estimator(batch, cfg)

        actor.get_advantage = flipped
    elif mutation == "shift_logprobs":
        original_lp = actor.next_token_logprobs
        actor.next_token_logprobs = lambda logits, mb: torch.roll(original_lp(logits, mb), 1)
    else:

        def no_push(self, version: int) -> None:
            self.version = version

        trainer_module.Trainer._sync_weights = no_push
