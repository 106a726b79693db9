"""The built-in environment of the queue-based API: math answers checked by math-verify."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from trainer.agent_env import EnvironmentService
from trainer.registry import register_env
from trainer.rewards import math_answer_correct


class MathSingleStepEnv(EnvironmentService):
    """Scores final answers against the reference with math-verify.

    The reference is found by qid (the part before any "@"): tell the env at the start
    of an episode with `await env.reset(options={"qid": qid, "answer": answer})`, or build
    it with `answers={qid: answer, ...}`. `step((qid, [text, ...]))` returns
    `(None, [1.0 or 0.0 per text], True, False, {})`; `step((qid, texts, answer))` scores
    against `answer` directly.
    """

    def __init__(self, answers: dict[str, Any] | None = None, max_tracked: int = 65536) -> None:
        self._answers: OrderedDict[str, str] = OrderedDict(
            (str(k), str(v)) for k, v in (answers or {}).items()
        )
        self.max_tracked = max_tracked

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        options = options or {}
        if "qid" in options and "answer" in options:
            qid = str(options["qid"]).split("@")[0]
            self._answers[qid] = str(options["answer"])
            self._answers.move_to_end(qid)
            while len(self._answers) > self.max_tracked:
                self._answers.popitem(last=False)
        return None, {}

    async def step(self, action: Any) -> tuple[Any, list[float], bool, bool, dict[str, Any]]:
        if not isinstance(action, (tuple, list)) or len(action) not in (2, 3):
            raise ValueError(
                f"math-single-step expects (qid, answers[, reference]), got {action!r}"
            )
        qid, answers = str(action[0]), action[1]
        if isinstance(answers, str):
            answers = [answers]
        if len(action) == 3:
            reference = str(action[2])
        else:
            reference = self._answers.get(qid.split("@")[0])
            if reference is None:
                raise ValueError(
                    f"math-single-step: no reference answer for qid {qid!r}; call "
                    "env.reset(options={'qid': ..., 'answer': ...}) first"
                )
        rewards = await asyncio.to_thread(
            lambda: [1.0 if math_answer_correct(str(a), reference) else 0.0 for a in answers]
        )
        return None, rewards, True, False, {}


register_env("math-single-step", MathSingleStepEnv)
