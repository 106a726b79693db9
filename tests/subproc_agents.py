"""Agents for tests/test_subproc_mode.py, loaded as "tests/subproc_agents.py:Class".

Loading by file path gives the module a generated name that a fresh interpreter cannot
import, so these exercise the subproc pool shipping the file to its workers.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path

from openai import OpenAI


class ReportingSyncAgent:
    """A synchronous ``openai.OpenAI()`` agent (URL and key from the env, no arguments).

    It writes what it saw (its pid, the env, the completion id) to ``report_dir`` and
    returns ``data["reward"]``. ``data["behave"]`` picks a misbehaviour instead.
    """

    def __init__(self, report_dir: str) -> None:
        self.report_dir = report_dir

    async def run(self, data: dict, **extra_kwargs) -> object:
        behave = data.get("behave", "chat")
        if behave == "raise":
            raise ValueError(f"agent failed on purpose ({data['tag']})")
        if behave == "raise_unpicklable":
            raise NeedsArgsError("weird", code=7)
        if behave == "exit":
            os._exit(1)
        marker = Path(self.report_dir) / f"died-{data.get('tag')}"
        if behave == "exit_once" and not marker.exists():  # the first run's process dies
            marker.touch()
            os._exit(1)
        if behave == "unpicklable_return":
            return {"x": threading.Lock()}
        client = OpenAI(max_retries=0, timeout=60)
        response = client.chat.completions.create(
            model="default", messages=data["messages"], max_tokens=16
        )
        report = {
            "tag": data.get("tag"),
            "pid": os.getpid(),
            "extra_kwargs": sorted(extra_kwargs),
            "base_url": os.environ.get("OPENAI_BASE_URL"),
            "api_key": os.environ.get("OPENAI_API_KEY"),
            "completion_id": response.id,
        }
        path = Path(self.report_dir) / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(report))
        return data.get("reward", 1.0)


class NeedsArgsError(Exception):
    """An exception that pickles but cannot be unpickled (keyword-only argument)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return f"{self.args[0]} (code {self.code})"


class LockedAgent:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    async def run(self, data: dict, **extra_kwargs) -> float:
        return 1.0


class LambdaAgent:
    def __init__(self) -> None:
        self.score = lambda text: 1.0

    async def run(self, data: dict, **extra_kwargs) -> float:
        return 1.0


def read_reports(report_dir: Path) -> list[dict]:
    """What each ReportingSyncAgent run wrote to `report_dir`, in file-name order."""
    return [json.loads(p.read_text()) for p in sorted(report_dir.glob("*.json"))]
