"""One trainer step against a bare PyTorch fwd+bwd+AdamW step on the same packed tokens.

The method: docs/benchmarks.md, "Trainer step against a bare PyTorch step". `--group N`
shapes the batch like a GRPO step (N sequences share a prompt) and runs the trainer with
`train.share_prefixes` on and off, into a section of its own.

    .venv/bin/python -m bench.trainer_step [--rounds 5] [--seqs 4] [--tokens 256] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from bench.report import alternate, arguments, measured_on, medians, publish, section, table


def samples(n_seqs: int, tokens: int, seed: int = 0, group: int = 1) -> list[dict]:
    rng = random.Random(seed)
    prompt = tokens // 4 if group == 1 else 3 * tokens // 4
    prompts = [[rng.randrange(100, 49000) for _ in range(prompt)] for _ in range(n_seqs)]
    return [
        {
            "input_ids": prompts[i // group]
            + [rng.randrange(100, 49000) for _ in range(tokens - prompt)],
            "loss_mask": [0] * prompt + [1] * (tokens - prompt),
            "logprobs": [0.0] * prompt + [-2.0] * (tokens - prompt),
            "versions": [-1] * prompt + [0] * (tokens - prompt),
            "returns": float(i % 2),
            "temperature": 1.0,
        }
        for i in range(n_seqs)
    ]


class BareStep:
    """The hand-written reference: one packed forward, masked PG loss, AdamW."""

    def __init__(self, model_dir, lr: float, batch: list[dict]) -> None:
        from gateway.inference.model_source import load_causal_lm

        self.model = load_causal_lm(model_dir, "cpu").float().train()
        self.model.config.use_cache = False
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        ids = [t for s in batch for t in s["input_ids"]]
        self.input_ids = torch.tensor([ids])
        self.position_ids = torch.tensor([[p for s in batch for p in range(len(s["input_ids"]))]])
        mask = torch.tensor([m for s in batch for m in s["loss_mask"]], dtype=torch.float32)
        self.targets = torch.nonzero(mask[1:] > 0).squeeze(1) + 1  # positions trained
        adv = [s["returns"] - 0.5 for s in batch for _ in s["input_ids"]]
        self.adv = torch.tensor(adv)[self.targets]

    def step(self) -> float:
        logits = self.model(
            input_ids=self.input_ids,
            position_ids=self.position_ids,
            logits_to_keep=self.targets - 1,
        ).logits[0]
        picked = logits.gather(-1, self.input_ids[0, self.targets][:, None]).squeeze(-1)
        logp = picked - torch.logsumexp(logits, -1)
        loss = -(logp * self.adv).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()


def main() -> None:
    ap = arguments(__doc__, rounds=5)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--group", type=int, default=1, help="sequences per shared prompt")
    args = ap.parse_args()

    from gateway.inference.model_source import resolve_model_dir
    from trainer.algorithm.actor import PPOActor, to_sequences
    from trainer.api.config import TrainConfig
    from trainer.backend.batches import pad_sequences
    from trainer.backend.deepspeed_engine import DeepSpeedEngine
    from trainer.rollout.agent_runner import Episode

    torch.manual_seed(0)
    model_dir = resolve_model_dir(None)
    batch = samples(args.seqs, args.tokens, group=args.group)
    episodes = [Episode(group=0, session_id=f"s{i}", samples=[s]) for i, s in enumerate(batch)]
    steps = {"bare": BareStep(model_dir, 1e-6, batch).step}
    # with no shared prompts (--group 1) the trainer packs the same tokens as the bare step
    shares = {"trainer": False} if args.group == 1 else {"trainer": True, "unshared": False}
    for name, share in shares.items():
        cfg = TrainConfig(lr=1e-6, micro_batch_tokens=args.seqs * args.tokens, share_prefixes=share)
        actor = PPOActor(DeepSpeedEngine(model_dir, cfg), cfg)
        steps[name] = lambda actor=actor: actor.train(pad_sequences(to_sequences(episodes)), 0)
    times = alternate(steps, args.rounds)
    med = medians(times)
    result: dict = {
        "tokens": args.seqs * args.tokens,
        "ratio": round(med["trainer"] / med["bare"], 3),
    }
    for name, ts in times.items():
        result[f"{name}_step_s"] = round(med[name], 2)
        result[f"{name}_steps"] = [round(t, 2) for t in ts]
    if "unshared" in med:
        result["speedup"] = round(med["unshared"] / med["trainer"], 3)
    print(json.dumps(result))
    publish(args, doc_section(args, result))


def doc_section(args: argparse.Namespace, result: dict) -> str:
    """The plain comparison, or with `--group` the shared-prompt one: each its own section."""
    group = f" --group {args.group}" if args.group > 1 else ""
    shared = f", prompts shared by {args.group}" if group else ""
    labels = {
        "trainer": f"trainer (PPOActor + DeepSpeed){shared}",
        "unshared": "trainer, every sequence in full",
        "bare": "bare PyTorch fwd+bwd+AdamW",
    }
    rows = [
        {"step": label, "median s": result[f"{k}_step_s"], "each round s": result[f"{k}_steps"]}
        for k, label in labels.items()
        if f"{k}_step_s" in result
    ]
    if group:
        verdict = (
            f"Sharing the prompt: **{result['speedup']:.2f}x** faster than packing every "
            f"sequence in full; **{result['ratio']:.2f}x** the bare step's time over all "
            "the tokens."
        )
    else:
        verdict = f"Ratio trainer / bare: **{result['ratio']:.2f}x** (target: at most 1.2x)."
    intro = (
        f"{measured_on()}, torch {torch.__version__}, {torch.get_num_threads()} threads: "
        f"`python -m bench.trainer_step --rounds {args.rounds} --seqs {args.seqs} --tokens "
        f"{args.tokens}{group}`, {result['tokens']} tokens per step before sharing, median "
        f"of {args.rounds} alternating rounds."
    )
    if group:
        name, writer = "trainer-step-shared", "bench/trainer_step.py --group"
    else:
        name, writer = "trainer-step", "bench/trainer_step.py"
    return section(name, writer, intro, table(rows, "lrl"), verdict)


if __name__ == "__main__":
    main()
