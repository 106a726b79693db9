"""ReMax on arithmetic problems: a token-level workflow plus a custom REINFORCE step.

ReMax uses the greedy answer as the baseline: for each prompt the workflow samples one
completion and decodes one greedily, at the same time, and trains the sampled one with
REINFORCE on the reward difference `r(sampled) - r(greedy)` (no value model, no group).

- `ReMaxRLVRWorkflow`: the `RolloutWorkflow` (`workflow:` in the config).
- `reinforce_loss_fn`: the loss on packed 1-D micro-batches.
- `ReinforceActor` / `DeepSpeedReinforceActor`: the training step, split into the
  backend-independent algorithm and the DeepSpeed engine it runs on
  (`train.engine_class` and `train.step_method: train_reinforce`).

Run it with `turnstile train --config agents/remax.yaml`. Loaded by file path
(agents/ is not an importable package).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.api import (
    ChatRenderer,
    DeepSpeedEngine,
    GenerationHyperparameters,
    LLMRequest,
    RolloutEngine,
    RolloutWorkflow,
    gather_logprobs,
    import_file,
    load_tokenizer,
    resolve_model_dir,
)

# the example task, loaded by path like the agent itself (agents/ is not a package)
math_answer_correct = import_file(Path(__file__).with_name("math_task.py")).math_answer_correct


def math_reward_fn(prompt: str, completions: str, prompt_ids, completion_ids, **data) -> float:
    """1.0 when the completion's final answer equals the row's `answer`, else 0.0."""
    return 1.0 if math_answer_correct(completions, str(data["answer"])) else 0.0


class ReMaxRLVRWorkflow(RolloutWorkflow):
    """Args: `gconfig` (GenerationHyperparameters fields), `tokenizer` (an object or a
    model folder; default: the bundled SmolLM2), `reward_fn` (default: math_reward_fn),
    `enable_thinking` (passed to chat templates that know it)."""

    def __init__(
        self,
        gconfig: GenerationHyperparameters | dict[str, Any] | None = None,
        tokenizer: Any = None,
        reward_fn: Callable[..., float] | None = None,
        enable_thinking: bool | None = None,
    ) -> None:
        if tokenizer is None or isinstance(tokenizer, str):
            tokenizer = load_tokenizer(resolve_model_dir(tokenizer))
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.gconfig = GenerationHyperparameters.coerce(gconfig, self.renderer.stop_token_ids)
        self.reward_fn = reward_fn or math_reward_fn
        self.enable_thinking = enable_thinking

    def _prompt_ids(self, data: dict[str, Any]) -> list[int]:
        messages = data.get("messages") or [{"role": "user", "content": data["question"]}]
        extra = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **extra
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _text(self, ids: list[int]) -> str:
        if ids and ids[-1] in self.renderer.stop_token_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def _reward(self, prompt: str, resp, data: dict[str, Any]) -> float:  # type: ignore[no-untyped-def]
        return float(
            await asyncio.to_thread(
                self.reward_fn,
                prompt=prompt,
                completions=self._text(resp.output_tokens),
                prompt_ids=resp.input_tokens,
                completion_ids=resp.output_tokens,
                **data,
            )
        )

    async def arun_episode(self, engine: RolloutEngine, data: dict[str, Any]) -> dict[str, Any]:
        input_ids = self._prompt_ids(data)
        rid = uuid.uuid4().hex  # one id for both: same prompt, same server
        sampled, greedy = await asyncio.gather(
            engine.agenerate(LLMRequest(rid=rid, input_ids=input_ids, gconfig=self.gconfig)),
            engine.agenerate(
                LLMRequest(rid=rid, input_ids=input_ids, gconfig=self.gconfig.new(greedy=True))
            ),
        )
        prompt_text = self.tokenizer.decode(input_ids)
        sample_reward, greedy_reward = await asyncio.gather(
            self._reward(prompt_text, sampled, data), self._reward(prompt_text, greedy, data)
        )
        n_in, n_out = sampled.input_len, sampled.output_len
        total = n_in + n_out
        advantage = float(sample_reward - greedy_reward)
        return {
            "input_ids": torch.tensor(sampled.input_tokens + sampled.output_tokens).unsqueeze(0),
            "loss_mask": torch.tensor([0] * n_in + [1] * n_out).unsqueeze(0),
            "versions": torch.tensor([-1] * n_in + sampled.output_versions).unsqueeze(0),
            "logprobs": torch.tensor(
                [0.0] * n_in + sampled.output_logprobs, dtype=torch.float32
            ).unsqueeze(0),
            "attention_mask": torch.ones(total, dtype=torch.bool).unsqueeze(0),
            # the reward difference, on every token
            "rewards": torch.full((1, total), advantage, dtype=torch.float32),
        }


def reinforce_loss_fn(logits: torch.Tensor, data: dict[str, torch.Tensor]) -> torch.Tensor:
    """REINFORCE on a packed micro-batch: -mean over trained tokens of reward * log p.

    `logits` is (T, V); `data` holds (T,) `input_ids`, `loss_mask`, `rewards` and
    `cu_seqlens` (sequence boundaries, (n + 1,)). The logits at position t predict token
    t + 1, so the labels, the mask and the rewards are all shifted one to the left; the
    last position of every sequence predicts nothing in it and is masked, so no sequence
    learns to predict the first token of the one packed after it.
    """
    input_ids = data["input_ids"]
    labels = torch.roll(input_ids, shifts=-1, dims=-1)
    mask = torch.roll(data["loss_mask"].bool(), shifts=-1, dims=-1)
    rewards = torch.roll(data["rewards"].to(logits.device, torch.float32), shifts=-1, dims=-1)
    cu = data["cu_seqlens"].long()
    mask[cu[1:] - 1] = False
    mask[int(cu[-1]) :] = False  # anything packed after the last sequence
    logprobs = gather_logprobs(logits, labels)
    loss = torch.where(mask, -logprobs * rewards, 0.0)
    return loss.sum() / mask.count_nonzero().clamp(min=1)


def _loss_weight(mb: dict[str, torch.Tensor]) -> torch.Tensor:
    return mb["loss_mask"].count_nonzero()


class ReinforceActor:
    """The algorithm, for any engine with `train_batch(data, loss_fn, loss_weight_fn)`."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def train_reinforce(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        train = getattr(self.engine, "train", None)
        if callable(train):
            train()  # training mode (dropout etc.)
        return self.engine.train_batch(
            batch, loss_fn=reinforce_loss_fn, loss_weight_fn=_loss_weight
        )


class DeepSpeedReinforceActor(DeepSpeedEngine):
    """The DeepSpeed engine with a `train_reinforce` step (`train.step_method`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor = ReinforceActor(self)

    def train_reinforce(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return self.actor.train_reinforce(*args, **kwargs)
