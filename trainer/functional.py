"""Small tensor helpers that user-written loss functions build on."""

from __future__ import annotations

import torch


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] at every position, without materialising log_softmax.

    `logits` is (T, V) for a packed 1-D batch and `labels` (T,); position t usually
    holds the NEXT token (`torch.roll(input_ids, -1)`), as the model predicts it there.
    """
    logits = logits.float()
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
