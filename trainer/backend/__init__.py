"""Training backends: DeepSpeed's `TrainEngine` (the contract is trainer/api/train_engine.py),
packed micro-batches and the token-logprob helpers a loss builds on. User code imports
from `trainer.api`."""
