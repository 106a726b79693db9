"""The multi-turn math agent with feedback, written against the queue-based agent API.

It behaves like agents/math_multi_turn.py (the OpenAI-SDK version) but works in token ids:
the problem is rendered with the tokenizer's chat template and put on `obs_queue`; the
driver answers with `gconfig.n_samples` completions; the `math-single-step` environment
scores them. A wrong answer gets the same retry message as a user turn, appended as
tokens, and that trajectory tries again, up to `num_turns` turns.

Each of the n_samples trajectories becomes one training sequence: everything the policy
generated (every turn) is trained on; the prompt and the feedback turns are masked. The
reward favours early success: `turn_penalty ** k` when the answer is right on turn
`k + 1` (1.0, 0.5, 0.25, ... by default), 0.0 when it never is.

Registered as "math-multi-turn". Use it from a trainer config with
`imports: [agents/math_multi_turn_queue.py]` and `agent: {name: math-multi-turn, args: ...}`
(agents/ is not an importable package: it is loaded by file path).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer.api import (
    Agent,
    BundledGenerationOutputs,
    ChatRenderer,
    EnvironmentService,
    GenerationHyperparameters,
    import_file,
    load_tokenizer,
    register_agent,
    resolve_model_dir,
)

# the example task; loading it registers the "math-single-step" environment
import_file(Path(__file__).with_name("math_task.py"))

RETRY_MESSAGE = "Unfortunately your answer is wrong. Let's try again."


@dataclass
class _Trajectory:
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    num_turns: int = 0
    done: bool = False

    def add(
        self, ids: list[int], logprobs: list[float] | None = None, versions: list[int] | None = None
    ) -> None:
        """A turn the policy generated (with its logprobs and versions: trained), or
        context it did not (the prompt, feedback: masked)."""
        generated = logprobs is not None
        self.input_ids += ids
        self.loss_mask += [int(generated)] * len(ids)
        self.logprobs += logprobs if generated else [0.0] * len(ids)
        self.versions += (versions or []) if generated else [-1] * len(ids)
        self.num_turns += int(generated)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "done"}


class MathMultiTurnQueueAgent(Agent):
    """Args: `gconfig` (GenerationHyperparameters fields; n_samples = trajectories per
    prompt), `num_turns`, `turn_penalty`, and `tokenizer` (an object or a model folder;
    default: the bundled SmolLM2)."""

    def __init__(
        self,
        gconfig: GenerationHyperparameters | dict[str, Any] | None = None,
        num_turns: int = 2,
        turn_penalty: float = 0.5,
        tokenizer: Any = None,
        tokenizer_path: str | None = None,
    ) -> None:
        if num_turns < 1:
            raise ValueError(f"num_turns must be >= 1, got {num_turns}")
        if tokenizer is None or isinstance(tokenizer, str):
            tokenizer = load_tokenizer(resolve_model_dir(tokenizer or tokenizer_path))
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.gconfig = GenerationHyperparameters.coerce(gconfig, self.renderer.stop_token_ids)
        self.num_turns = num_turns
        self.turn_penalty = turn_penalty
        # what follows an answer: the retry message as a user turn, then the assistant's
        # header; after an answer cut off before its end token, that token first
        self._feedback = self._after_answer([self.renderer.eos_token_id])
        self._feedback_after_cut = self._after_answer([])

    def _after_answer(self, answer: list[int]) -> list[int]:
        """The template's own tokens after `answer`'s, as `render_token_exact` finds them
        (so no default system prompt is repeated)."""
        turns = [
            {"role": "user", "content": "-"},
            {"role": "assistant", "content": "-"},
            {"role": "user", "content": RETRY_MESSAGE},
        ]
        rendered = self.renderer.render_token_exact(turns, 2, ([], answer))
        if rendered.fallback is not None:
            raise ValueError(f"cannot render the feedback turn on its own: {rendered.fallback}")
        return list(rendered.ids[len(answer) :])

    def _prompt_ids(self, prompt: dict[str, Any]) -> list[int]:
        messages = prompt.get("messages") or [{"role": "user", "content": prompt["question"]}]
        return self.renderer.render([dict(m) for m in messages]).ids

    def _answer_text(self, output_ids: list[int]) -> str:
        ids = list(output_ids)
        if ids and ids[-1] in self.renderer.stop_token_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def collect_trajectory(
        self,
        prompt: dict[str, Any],
        env: EnvironmentService,
        obs_queue: asyncio.Queue,
        act_queue: asyncio.Queue,
    ) -> list[dict[str, Any]]:
        qid = str(prompt["qid"])
        await env.reset(options={"qid": qid, "answer": str(prompt["answer"])})
        prompt_ids = self._prompt_ids(prompt)
        n = self.gconfig.n_samples
        trajs = [_Trajectory() for _ in range(n)]
        for t in trajs:
            t.add(prompt_ids)
        one_sample = self.gconfig.new(n_samples=1)
        reward_if_right = 1.0
        for turn in range(self.num_turns):
            # which (bundle, index in bundle) answers each still-open trajectory
            got: dict[int, tuple[BundledGenerationOutputs, int]] = {}
            if turn == 0:
                await obs_queue.put((qid, prompt_ids, self.gconfig))
                act = await act_queue.get()
                got = {i: (act, i) for i in range(n)}
            else:
                open_ids = [i for i, t in enumerate(trajs) if not t.done]
                for i in open_ids:
                    await obs_queue.put((f"{qid}@{i}", list(trajs[i].input_ids), one_sample))
                by_qid = {}
                for _ in open_ids:
                    act = await act_queue.get()
                    by_qid[act.qid] = act
                got = {i: (by_qid[f"{qid}@{i}"], 0) for i in open_ids}

            order = sorted(got)
            for i in order:
                act, j = got[i]
                trajs[i].add(act.output_ids[j], act.logprobs[j], act.versions[j])
            answers = [self._answer_text(got[i][0].output_ids[got[i][1]]) for i in order]
            _, rewards, *_ = await env.step((qid, answers))

            last_turn = turn == self.num_turns - 1
            for k, i in enumerate(order):
                traj = trajs[i]
                if float(rewards[k]) > 0:
                    traj.reward = reward_if_right
                    traj.done = True
                elif last_turn:
                    traj.reward = 0.0
                    traj.done = True
                else:
                    act, j = got[i]
                    traj.add(self._feedback_after_cut if act.no_eos[j] else self._feedback)
            reward_if_right *= self.turn_penalty
            if all(t.done for t in trajs):
                break
        return [t.to_dict() for t in trajs]


register_agent("math-multi-turn", MathMultiTurnQueueAgent)
