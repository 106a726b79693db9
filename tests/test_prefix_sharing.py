"""A prompt shared by a group's samples is run once, and training sees the same numbers.

Checked on a tiny Llama (real transformers attention, sdpa): the logprobs of every
trained token and the gradient of every weight are the same with sharing as with each
sequence packed in full.
"""

from __future__ import annotations

import torch
from trainer_helpers import tiny_llama

from trainer.backend.batches import micro_batches
from trainer.backend.functional import forward_logits, next_token_logprobs
from trainer.backend.prefix_sharing import families, shared_prefix


def _seq(prompt: list[int], output: list[int], adv: float) -> dict[str, torch.Tensor]:
    ids = torch.tensor(prompt + output)
    mask = torch.tensor([0] * len(prompt) + [1] * len(output))
    return {
        "input_ids": ids,
        "loss_mask": mask,
        "advantages": torch.tensor(adv, dtype=torch.float64),
    }


def _rows(seqs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    return [{**s, "row": torch.tensor(i)} for i, s in enumerate(seqs)]


def _group() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 500, (40,), generator=g).tolist()
    other = torch.randint(3, 500, (30,), generator=g).tolist()
    out = lambda n: torch.randint(3, 500, (n,), generator=g).tolist()  # noqa: E731
    first = out(6)
    return [
        _seq(prompt, first, 1.0),
        _seq(prompt, out(9), -0.5),
        _seq(other, out(5), 0.7),  # shares nothing: packed in full
        _seq(prompt, out(4), 0.25),
        # a second turn: the prompt, the first answer (untrained here), then its own answer
        _seq(prompt + first + [7, 8, 9], out(5), -1.0),
    ]


def test_sequences_sharing_a_prompt_keep_only_their_own_tokens() -> None:
    seqs = _group()
    assert shared_prefix(seqs[0], seqs[1]) == 40
    assert shared_prefix(seqs[0], seqs[4]) == 40  # the first answer is trained in seqs[0]
    fams = families(seqs, max_tokens=512)
    assert [f.owner for f in fams] == [0, 2]
    assert [i for i, _ in fams[0].members] == [0, 1, 3, 4]

    (mb,) = micro_batches(seqs, max_tokens=512, share_prefixes=True)
    full = sum(int(s["input_ids"].numel()) for s in seqs)
    assert mb["input_ids"].numel() == full - 3 * 39  # three copies of the prompt but one token
    # a family is packed together, its owner first
    assert mb["advantages"].tolist() == [1.0, -0.5, 0.25, -1.0, 0.7]
    assert mb["offset"].tolist() == [0, 39, 39, 39, 0]
    starts = mb["cu_seqlens"][:-1].tolist()
    assert mb["position_ids"][starts].tolist() == [0, 39, 39, 39, 0]
    assert mb["loss_mask"].sum() == sum(s["loss_mask"].sum() for s in seqs)
    assert mb["prefix_mask"].shape == (1, 1, mb["input_ids"].numel(), mb["input_ids"].numel())
    # sharing off, or a budget too small for a family: every sequence in full
    assert all("offset" not in m for m in micro_batches(seqs, 512, share_prefixes=False))
    small = micro_batches(seqs, max_tokens=46, share_prefixes=True)
    assert sum(m["input_ids"].numel() for m in small) == full


def _loss_and_grads(model: torch.nn.Module, mbs: list[dict[str, torch.Tensor]]):  # type: ignore[no-untyped-def]
    model.zero_grad()
    total = torch.zeros(())
    trained: dict[int, torch.Tensor] = {}  # per sequence, by its row
    for mb in mbs:
        logprobs = next_token_logprobs(forward_logits(model, mb), mb)
        adv = torch.repeat_interleave(mb["advantages"], mb["cu_seqlens"].diff())
        total = total + (logprobs * adv * mb["loss_mask"]).sum()
        bounds = mb["cu_seqlens"].tolist()
        for row, a, b in zip(mb["row"].tolist(), bounds[:-1], bounds[1:], strict=True):
            trained[row] = logprobs[a:b][mb["loss_mask"][a:b] > 0].detach()
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return float(total.detach()), torch.cat([trained[r] for r in sorted(trained)]), grads


def test_shared_prefixes_give_the_same_logprobs_and_gradients() -> None:
    model = tiny_llama()
    seqs = _rows(_group())
    shared = micro_batches(seqs, max_tokens=512, share_prefixes=True)
    plain = micro_batches(seqs, max_tokens=512, share_prefixes=False)
    assert "prefix_mask" in shared[0] and sum(m["input_ids"].numel() for m in shared) < sum(
        m["input_ids"].numel() for m in plain
    )
    loss_s, lp_s, grads_s = _loss_and_grads(model, shared)
    loss_p, lp_p, grads_p = _loss_and_grads(model, plain)
    assert torch.allclose(lp_s, lp_p, atol=1e-5)
    assert abs(loss_s - loss_p) < 1e-4
    for name, g in grads_p.items():
        assert torch.allclose(grads_s[name], g, atol=1e-5, rtol=1e-4), name
