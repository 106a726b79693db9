"""Training backends: the `TrainEngine` contract, DeepSpeed's implementation, the batch type.

Import from here. An algorithm needs `TrainEngine.train_batch`, the padded batch it
takes (`pad_sequences`) and the token-logprob helpers its loss builds on.
"""

from trainer.backend.batches import pad_sequences
from trainer.backend.deepspeed_engine import DeepSpeedEngine
from trainer.backend.functional import (
    forward_logits,
    gather_logprobs,
    next_token_entropy,
    next_token_logprobs,
    predicting_positions,
)
from trainer.backend.train_engine import LossFn, LossWeightFn, TrainEngine

__all__ = [
    "DeepSpeedEngine",
    "LossFn",
    "LossWeightFn",
    "TrainEngine",
    "forward_logits",
    "gather_logprobs",
    "next_token_entropy",
    "next_token_logprobs",
    "pad_sequences",
    "predicting_positions",
]
