"""The agent of tests/test_two_nodes.py: one chat turn through the OpenAI SDK, then a
report of where it ran (node address, pid), which gateway it talked to and the
completion id it got, in `report_dir`. Returns a random reward, so every group has
signal and the weights move.

Once `hold_after` reports exist (the later steps' episodes), it writes a `held-*`
marker after its turn and waits for a `release` file: the test kills its node then.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from pathlib import Path

from openai import OpenAI


class NodeReportingAgent:
    def __init__(self, report_dir: str, hold_after: int = 0) -> None:
        self.report_dir = report_dir
        self.hold_after = hold_after

    async def run(self, data: dict, **extra_kwargs) -> float:
        import ray

        client = OpenAI(base_url=extra_kwargs["base_url"], api_key=extra_kwargs["api_key"],
                        max_retries=0, timeout=120)  # fmt: skip
        response = client.chat.completions.create(
            model="default", messages=data["messages"], max_tokens=6
        )
        folder = Path(self.report_dir)
        report = {
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "base_url": extra_kwargs["base_url"],
            "completion_id": response.id,
        }
        (folder / f"report-{uuid.uuid4().hex}.json").write_text(json.dumps(report))
        if self.hold_after and len(list(folder.glob("report-*.json"))) > self.hold_after:
            (folder / f"held-{uuid.uuid4().hex}").write_text(json.dumps(report))
            while not (folder / "release").exists():
                time.sleep(0.2)
        return random.random()
