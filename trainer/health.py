"""Is the run healthy? What each step's answers look like, and one warning when a run
moves the way a collapse does.

A collapsing policy (docs/training.md, "Signals of a collapse") drifts into long,
repetitive answers that the reward no longer separates: answers get cut at `max_tokens`,
repeat themselves, lose entropy, move away from the starting policy, and training
reward falls from its best. Each of these is logged every step; `CollapseWatch` prints
one line when they move together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.run_log import mean

NGRAM = 4  # repetition is measured on token 4-grams


def repetition(tokens: list[int], n: int = NGRAM) -> float:
    """Share of an answer's token n-grams that already occurred earlier in it: 0 for an
    answer that never repeats itself, near 1 for one phrase over and over."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def answer_signals(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Over a step's samples: mean trained (answer) tokens, the share cut off at the
    token limit (finish_reason "length"), and mean repetition of the answer tokens."""
    answers = [
        [t for t, m in zip(s["input_ids"], s["loss_mask"], strict=True) if m] for s in samples
    ]
    if not answers:
        return {}
    cut = [(s.get("meta") or {}).get("finish_reason") == "length" for s in samples]
    return {
        "answer_tokens_mean": sum(map(len, answers)) / len(answers),
        "truncated_frac": sum(cut) / len(cut),
        "repetition": sum(map(repetition, answers)) / len(answers),
    }


@dataclass
class CollapseWatch:
    """Thresholds of a collapse, checked on every step's metrics row.

    - `truncated_frac` >= `max_truncated`: half the answers run into the token limit;
    - `repetition` >= `max_repetition`: answers repeat their own phrases;
    - `entropy` below `min_entropy_ratio` x its mean over the first `baseline_steps`;
    - `kl_ref` above `max_kl`: far from the starting policy;
    - training reward (mean of the last `window` steps) below `reward_drop` x the best
      such mean, once that best reached `min_best_reward`.
    It warns when the reward fell and one other signal fired, or when answers are both
    cut off and repetitive, whatever the reward (the text itself degenerates). Falling
    entropy and rising KL alone are what learning looks like too: they count only beside
    a falling reward. `logprob_mismatch` above `max_mismatch` is a warning on its own:
    the trainer no longer scores the sampler's tokens as the sampler did (prime-rl fails
    its tests above 0.02).
    """

    max_truncated: float = 0.5
    max_repetition: float = 0.3
    min_entropy_ratio: float = 0.3
    max_kl: float = 0.5
    reward_drop: float = 0.5
    min_best_reward: float = 0.2
    max_mismatch: float = 0.02
    window: int = 3
    baseline_steps: int = 3
    rows: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)
    best_reward: float | None = field(default=None, init=False)
    firing: bool = field(default=False, init=False)

    def check(self, row: dict[str, Any]) -> str | None:
        """The warning line for this step, or None. One line when a collapse starts;
        while it holds, nothing more until it has cleared."""
        self.rows.append(row)
        found = self._form_reasons(row)
        reasons = list(found.values())
        fell = self._reward_fell()
        degenerate = {"truncated", "repetition"} <= found.keys()
        firing = (fell is not None and bool(reasons)) or degenerate
        if fell is not None:
            reasons.insert(0, fell)
        mismatch = row.get("logprob_mismatch")
        if mismatch is not None and mismatch > self.max_mismatch:
            reasons.append(f"sampler/trainer logprob mismatch {mismatch:.3f} > {self.max_mismatch}")
            firing = True
        was, self.firing = self.firing, firing
        if not firing or was:
            return None
        return f"warning: step {row.get('step')} looks like a collapse: " + "; ".join(reasons)

    def _form_reasons(self, row: dict[str, Any]) -> dict[str, str]:
        """The form signals that fired this step: signal -> its reason, as printed."""
        out = {}
        trunc, rep, kl = row.get("truncated_frac"), row.get("repetition"), row.get("kl_ref")
        if trunc is not None and trunc >= self.max_truncated:
            out["truncated"] = f"{trunc:.0%} of answers cut off at max_tokens"
        if rep is not None and rep >= self.max_repetition:
            out["repetition"] = f"repetition {rep:.2f} >= {self.max_repetition}"
        if kl is not None and kl > self.max_kl:
            out["kl"] = f"KL to the starting policy {kl:.3f} > {self.max_kl}"
        base = [r["entropy"] for r in self.rows[: self.baseline_steps] if "entropy" in r]
        ent = row.get("entropy")
        if ent is not None and len(base) == self.baseline_steps:
            if ent < self.min_entropy_ratio * mean(base):
                out["entropy"] = (
                    f"entropy {ent:.3f} < {self.min_entropy_ratio} x its start {mean(base):.3f}"
                )
        return out

    def _reward_fell(self) -> str | None:
        rewards = [r.get("reward_mean") for r in self.rows[-self.window :]]
        if len(rewards) < self.window or any(r is None for r in rewards):
            return None
        now = sum(rewards) / self.window
        best = self.best_reward
        self.best_reward = now if best is None else max(best, now)
        if best is None or best < self.min_best_reward or now >= self.reward_drop * best:
            return None
        return f"training reward {now:.2f} (last {self.window} steps) from a best of {best:.2f}"
