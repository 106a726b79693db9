"""A multi-turn math agent written with the plain OpenAI SDK, unchanged for training.

Nothing in it knows about Turnstile: it reads ``base_url`` / ``api_key`` (and optionally a
shared ``http_client``) from ``extra_kwargs`` or from ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY``, talks to whatever OpenAI-compatible server that points at, and returns
a reward. Pointed at the gateway, every completion it makes is recorded for training.

It asks the question; when the answer is wrong it says so and lets the model try again,
up to ``max_turns`` turns. The reward favours early success: ``turn_penalty ** k`` when
the answer is right on turn ``k + 1`` (1.0, 0.5, 0.25, ... by default), 0.0 when it never
is. The reward returned as a float goes to the last completion of the session.

An answer cut off at ``max_tokens`` counts as wrong, whatever its last number: its
number may be cut too ("The answer is 2" of 25), and a policy that repeats "The answer
is 28." until the limit would otherwise be paid for it (``require_stop=False`` to
score such answers all the same). So does a reply that states two different answers
("The answer is 3. The answer is 5."). Either is *malformed*, and an episode with a
malformed reply loses ``malformed_penalty`` (0.2) from its reward: a rambling or
hedging reply ranks below a clean wrong one, so that the group baseline pushes the
policy away from the form a collapsing run drifts into (docs/demo-run.md), not only
towards the right number.

Load it by file path, e.g. ``workflow="agents/math_multi_turn.py:MathMultiTurnAgent"``.
"""

from __future__ import annotations

import os
from pathlib import Path

from openai import AsyncOpenAI

from trainer.api import import_file

# the example task, loaded by path like the agent itself (agents/ is not a package)
_task = import_file(Path(__file__).with_name("math_task.py"))
math_answer_correct, stated_answers = _task.math_answer_correct, _task.stated_answers


RETRY_MESSAGE = "Unfortunately your answer is wrong. Let's try again."


class MathMultiTurnAgent:
    def __init__(
        self,
        max_turns: int = 2,
        max_tokens: int = 64,
        temperature: float = 1.0,
        turn_penalty: float = 0.5,
        model: str = "default",
        require_stop: bool = True,
        malformed_penalty: float = 0.2,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.turn_penalty = turn_penalty
        self.model = model
        self.require_stop = require_stop
        self.malformed_penalty = malformed_penalty

    async def run(self, data: dict, **extra_kwargs) -> float:
        http_client = extra_kwargs.get("http_client")
        base_url = extra_kwargs.get("base_url") or os.getenv("OPENAI_BASE_URL")
        api_key = extra_kwargs.get("api_key") or os.getenv("OPENAI_API_KEY")
        client_kwargs = {"base_url": base_url, "api_key": api_key, "max_retries": 0}
        if http_client is not None:
            client_kwargs["http_client"] = http_client
        client = AsyncOpenAI(**client_kwargs)

        try:
            return await self._solve(client, data)
        finally:
            if http_client is None:  # a shared client belongs to the caller
                await client.close()

    async def _solve(self, client: AsyncOpenAI, data: dict) -> float:
        messages = [dict(m) for m in data["messages"]]
        answer = str(data["answer"])
        reward = 1.0
        malformed = False
        for _ in range(self.max_turns):
            response = await client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
            choice = response.choices[0]
            content = choice.message.content or ""
            cut = self.require_stop and choice.finish_reason == "length"
            hedged = len(stated_answers(content)) > 1
            malformed = malformed or cut or hedged
            if not (cut or hedged) and math_answer_correct(content, answer):
                return reward - self.malformed_penalty * malformed
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": RETRY_MESSAGE})
            reward *= self.turn_penalty
        return 0.0 - self.malformed_penalty * malformed
