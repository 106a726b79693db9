"""Token-logprob helpers that loss functions build on (built-in ones and users' alike)."""

from __future__ import annotations

import torch


def forward_logits(model: torch.nn.Module, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's float32 logits on a packed micro-batch: (T, V), or (K, V) for the K
    positions of `mb["logits_mask"]`, the only ones then sent through the LM head."""
    keep = mb.get("logits_mask")
    extra = {} if keep is None else {"logits_to_keep": torch.nonzero(keep, as_tuple=True)[0]}
    if "prefix_mask" in mb:  # sequences that read another's prompt (prefix_sharing.py)
        extra["attention_mask"] = mb["prefix_mask"]
    out = model(
        input_ids=mb["input_ids"].long().unsqueeze(0),
        position_ids=mb["position_ids"].long().unsqueeze(0),
        use_cache=False,
        **extra,
    )
    return out.logits[0].float()


def predicting_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Bool mask of the positions whose NEXT token is trained (a `logits_mask`), for
    (L,), (B, L) or packed (T,) masks where no sequence's first token is trained."""
    keep = torch.zeros_like(loss_mask, dtype=torch.bool)
    keep[..., :-1] = loss_mask[..., 1:] > 0
    return keep


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] at every position, without materialising log_softmax.

    `logits` is (T, V) for a packed 1-D batch and `labels` (T,); position t usually
    holds the NEXT token (`torch.roll(input_ids, -1)`), as the model predicts it there.
    """
    logits = logits.float()
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def next_token_logprobs(logits: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """(T,) logprob of every token given the ones before it: entry j is for input_ids[j].

    `logits` are what `train_batch` handed the loss: all T positions, or only those in
    `mb["logits_mask"]` when the micro-batch has one. Entries whose logits were not
    computed, and each sequence's first token, are 0. Where the micro-batch holds a
    sampling `temperature` (per token or per sequence), the logits are divided by it
    first: the distribution the inference engine sampled from and took logprobs of.
    """
    logits, targets = _sampled_distribution(logits, mb)
    ids = mb["input_ids"]
    return _per_token(gather_logprobs(logits, ids[targets]), targets, mb)


def next_token_entropy(logits: torch.Tensor, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """(T,) entropy (nats) of the distribution each token was sampled from, aligned and
    temperature-scaled as `next_token_logprobs`. Falling entropy is the first sign of a
    policy collapsing onto one answer form."""
    logits, targets = _sampled_distribution(logits, mb)
    logp = torch.log_softmax(logits, dim=-1)
    return _per_token(-(logp.exp() * logp).sum(-1), targets, mb)


def _sampled_distribution(
    logits: torch.Tensor, mb: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of the positions that predict a token, temperature-scaled, and the
    index of the token each predicts."""
    ids = mb["input_ids"]
    if "logits_mask" in mb:
        rows = torch.nonzero(mb["logits_mask"], as_tuple=True)[0]
    else:
        rows = torch.arange(ids.shape[0] - 1, device=ids.device)
        logits = logits[:-1]  # the last position predicts nothing in the micro-batch
    targets = rows + 1
    logits = logits.float()
    if "temperature" in mb:
        temperature = mb["temperature"]  # per token, or per sequence: repeat it
        if temperature.shape != ids.shape and "cu_seqlens" in mb:
            temperature = torch.repeat_interleave(temperature, mb["cu_seqlens"].long().diff())
        logits = logits / temperature[targets].unsqueeze(-1)
    return logits, targets


def _per_token(
    values: torch.Tensor, targets: torch.Tensor, mb: dict[str, torch.Tensor]
) -> torch.Tensor:
    out = torch.zeros(mb["input_ids"].shape[0], dtype=torch.float32, device=values.device)
    out = out.index_put((targets,), values.float())
    if "cu_seqlens" in mb:  # nothing predicts a sequence's first token
        out[mb["cu_seqlens"][:-1].long()] = 0.0
    return out
