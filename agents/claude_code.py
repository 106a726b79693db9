"""Training a Claude Code agent: one Claude Code task per episode, through claude-agent-sdk.

Each episode runs agents/claude_code_episode.py with the Claude Code client venv's
Python (`.venv-clients/claude_code`, made by `make clients-setup`: claude-agent-sdk and
the CLI it bundles), inside `unshare -n` (needs root): a network namespace with only
loopback, so nothing the CLI tries can leave the machine. The episode's
`ClaudeAgentOptions(env=...)` get `ANTHROPIC_BASE_URL` (the gateway, relayed into the
namespace through a Unix socket) and `ANTHROPIC_API_KEY` (this episode's session key),
so every request of the episode is recorded in its own session.

The task (`file_tasks`): create a file with given content using the Bash tool. The
reward checks the result: 1.0 when the file holds exactly the word asked for, 0.2 when
a file of that name exists with something else in it, else 0.0. It goes to the
session's last turn (the trainer's rule for a float reward).

    workflow: agents/claude_code.py:ClaudeCodeAgent
    dataset: {type: python, function: agents/claude_code.py:file_tasks, size: 64}
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from claude_code_relay import unix_to_tcp  # noqa: E402

EPISODE = HERE / "claude_code_episode.py"
RESULT_PREFIX = "CLIENT-RESULT "
_WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "piano", "lemon", "comet"]
_NAMES = ["note", "answer", "word", "result", "out"]


def file_tasks(size: int, seed: int = 0) -> list[dict[str, Any]]:
    """`size` tasks, deterministically from `seed`: write one word to one file."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        name, word = f"{rng.choice(_NAMES)}.txt", rng.choice(_WORDS)
        prompt = f"Use Bash to create a file named {name} that contains only the word {word}."
        rows.append({"prompt": prompt, "file": name, "content": word})
    return rows


def file_reward(workdir: Path, data: dict[str, Any]) -> float:
    path = workdir / data["file"]
    if not path.is_file():
        return 0.0
    return 1.0 if path.read_text(errors="replace").strip() == data["content"] else 0.2


class ClaudeCodeAgent:
    def __init__(
        self,
        python: str = ".venv-clients/claude_code/bin/python",
        max_output_tokens: int = 64,
        max_turns: int = 3,
        max_answers: int = 0,
        timeout_s: float = 1800.0,
    ) -> None:
        self.python = python
        self.max_output_tokens = max_output_tokens
        self.max_turns = max_turns
        self.max_answers = max_answers  # 0: until Claude Code is done
        self.timeout_s = timeout_s

    async def run(self, data: dict, **extra_kwargs: Any) -> float:
        gateway = urlparse(extra_kwargs["base_url"])
        with tempfile.TemporaryDirectory(prefix="claude-code-") as tmp:
            workdir, socket = Path(tmp) / "work", str(Path(tmp) / "gateway.sock")
            server = await unix_to_tcp(socket, gateway.port or 80, gateway.hostname or "127.0.0.1")
            try:
                await self._episode(data["prompt"], extra_kwargs["api_key"], socket, workdir)
            finally:
                server.close()
            return file_reward(workdir, data)

    async def _episode(self, prompt: str, api_key: str, socket: str, workdir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        # Claude Code asks for 32k+ tokens by default; a small model gets a short answer
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.max_output_tokens)
        env["MAX_THINKING_TOKENS"] = "0"
        proc = await asyncio.create_subprocess_exec(
            "unshare", "-n", self.python, str(EPISODE),
            "--socket", socket, "--api-key", api_key, "--workdir", str(workdir),
            "--prompt", prompt, "--max-turns", str(self.max_turns),
            "--answers", str(self.max_answers),
            env=env, cwd=str(HERE),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        lines = [ln for ln in out.decode().splitlines() if ln.startswith(RESULT_PREFIX)]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"Claude Code episode failed ({proc.returncode}): {err[-2000:]!r}")
        json.loads(lines[-1][len(RESULT_PREFIX) :])  # a well-formed result, or an error
