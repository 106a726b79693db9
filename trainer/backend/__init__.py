"""Training backends: the `TrainEngine` contract, DeepSpeed's implementation, the batch type.

Import from here. An algorithm needs `TrainEngine.train_batch`, the batch helpers
(`pad_sequences` builds the padded batch it takes) and the token-logprob helpers.
"""

from trainer.backend.batches import SampleError, micro_batches, pad_sequences, split_padded
from trainer.backend.deepspeed_engine import DeepSpeedEngine
from trainer.backend.functional import (
    forward_logits,
    gather_logprobs,
    next_token_logprobs,
    predicting_positions,
)
from trainer.backend.train_engine import LossFn, LossWeightFn, TrainEngine

__all__ = [
    "DeepSpeedEngine",
    "LossFn",
    "LossWeightFn",
    "SampleError",
    "TrainEngine",
    "forward_logits",
    "gather_logprobs",
    "micro_batches",
    "next_token_logprobs",
    "pad_sequences",
    "predicting_positions",
    "split_padded",
]
