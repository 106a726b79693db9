"""A single-turn math agent on the synchronous ``openai.OpenAI`` client, for ``mode: subproc``.

It blocks while the model answers, so it belongs in a worker process, not on the
trainer's event loop: run it with ``rollout.agent.mode: subproc``. There each run happens
in a process whose ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` point at the gateway with that
run's session key, which is all ``OpenAI()`` needs; the agent takes no URL or key itself.
The agent and the data row are pickled to the worker, so keep the agent's state plain.

Reward: 1.0 when the answer (checked with math-verify) equals ``data["answer"]``, else
0.0; it goes to the session's only completion. Data rows look like
``{"messages": [...], "answer": "42"}``, as for ``math_multi_turn.py``.

    workflow: agents/math_sync_openai.py:MathSyncOpenAIAgent
    rollout: {agent: {mode: subproc, subproc_max_workers: 4}}
"""

from __future__ import annotations

from pathlib import Path

from openai import OpenAI

from trainer.api import import_file

# the example task, loaded by path like the agent itself (agents/ is not a package)
math_answer_correct = import_file(Path(__file__).with_name("math_task.py")).math_answer_correct


class MathSyncOpenAIAgent:
    def __init__(
        self, max_tokens: int = 64, temperature: float = 1.0, model: str = "default"
    ) -> None:
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.model = model

    async def run(self, data: dict, **extra_kwargs) -> float:
        # A sync client, built inside `run` (clients do not pickle), from the environment.
        with OpenAI(max_retries=0) as client:
            response = client.chat.completions.create(
                model=self.model,
                messages=data["messages"],
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
        content = response.choices[0].message.content or ""
        return 1.0 if math_answer_correct(content, str(data["answer"])) else 0.0
