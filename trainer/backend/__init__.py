"""Training backends: the `TrainEngine` contract, DeepSpeed's implementation, the batch type.

Import from here. An algorithm needs `TrainEngine.train_batch`, the batch helpers
(`pad_sequences` builds the padded batch it takes) and the token-logprob helpers.
"""

from trainer.backend.batches import SampleError, micro_batches, pad_sequences, split_padded
from trainer.backend.deepspeed_engine import DeepSpeedEngine
from trainer.backend.functional import gather_logprobs, next_token_logprobs
from trainer.backend.train_engine import LossFn, LossWeightFn, TrainEngine

__all__ = [
    "DeepSpeedEngine",
    "LossFn",
    "LossWeightFn",
    "SampleError",
    "TrainEngine",
    "gather_logprobs",
    "micro_batches",
    "next_token_logprobs",
    "pad_sequences",
    "split_padded",
]
