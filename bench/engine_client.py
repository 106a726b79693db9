"""CPU per request of the two HTTP clients an engine client could use: httpx and aiohttp.

Each turn the gateway serves from an external engine is one POST of ~600 prompt ids to
`/generate`, so the client's own CPU is paid per turn. This starts bench/engine_server.py
in its own process and sends the same body through each client in turn (alternating
rounds, the machine's speed drifts), measuring this process's CPU time per request.

    python -m bench.engine_client          # ~30 s
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import aiohttp
import httpx

from bench.procs import free_port

BODY = json.dumps(
    {
        "input_ids": list(range(600)),
        "sampling_params": {"max_new_tokens": 64},
        "return_logprob": True,
    }
).encode()
N = 1500


async def with_httpx(url: str) -> float:
    async with httpx.AsyncClient(trust_env=False) as client:
        for _ in range(50):
            await client.post(url, content=BODY)
        t = time.process_time()
        for _ in range(N):
            assert (await client.post(url, content=BODY)).status_code == 200
        return (time.process_time() - t) / N * 1000


async def with_aiohttp(url: str) -> float:
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession() as session:
        for _ in range(50):
            async with session.post(url, data=BODY, headers=headers) as r:
                await r.read()
        t = time.process_time()
        for _ in range(N):
            async with session.post(url, data=BODY, headers=headers) as r:
                await r.read()
        return (time.process_time() - t) / N * 1000


def main() -> int:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.engine_server", "--port", str(port),
         "--ids", "504,3365,2", "--text", "hi", "--eos", "2"],
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/generate"
        for rnd in range(3):
            hx, ah = asyncio.run(with_httpx(url)), asyncio.run(with_aiohttp(url))
            print(f"round {rnd + 1}: httpx {hx:.2f} ms, aiohttp {ah:.2f} ms CPU per request "
                  f"({hx / ah:.1f}x)")  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
