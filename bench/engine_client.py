"""CPU per request of the HTTP clients an engine client could use: httpx, aiohttp as it
comes, and aiohttp as the gateway sets it up (gateway/inference/remote.py `open_session`).

Each turn the gateway serves from an external engine is one POST of ~600 prompt ids, so
the client's CPU is paid per turn. The same body goes to bench/engine_server.py through
each client in alternating rounds, on uvloop (the gateway's loop).

    python -m bench.engine_client          # ~30 s
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import uvloop

from bench import engine_server
from bench.procs import run_children
from gateway.inference.remote import ServerOptions, open_session

BODY = json.dumps(
    {
        "input_ids": list(range(600)),
        "sampling_params": {"max_new_tokens": 64},
        "return_logprob": True,
    }
).encode()
HEADERS = {"Content-Type": "application/json"}
N = 1500
WARM_UP = 50


async def per_request(send: Callable[[], Awaitable[None]]) -> float:
    """CPU ms per request of `send`, after a warm-up."""
    for _ in range(WARM_UP):
        await send()
    t = time.process_time()
    for _ in range(N):
        await send()
    return (time.process_time() - t) / N * 1000


async def with_httpx(url: str) -> float:
    async with httpx.AsyncClient(trust_env=False) as client:

        async def send() -> None:
            assert (await client.post(url, content=BODY, headers=HEADERS)).status_code == 200

        return await per_request(send)


async def with_aiohttp(url: str, session: aiohttp.ClientSession | None = None) -> float:
    """aiohttp as it comes, or through `session` (the gateway's, by `with_gateway`)."""
    async with session or aiohttp.ClientSession(headers=HEADERS) as http:

        async def send() -> None:
            async with http.post(url, data=BODY) as r:
                assert r.status == 200
                await r.read()

        return await per_request(send)


async def with_gateway(url: str) -> float:
    return await with_aiohttp(url, open_session(ServerOptions()))


def main() -> int:
    with run_children("turnstile-engine-client-") as children:
        url = engine_server.start(children, [504, 3365, 2], "hi") + "/generate"
        for rnd in range(3):
            hx, ah, gw = (uvloop.run(f(url)) for f in (with_httpx, with_aiohttp, with_gateway))
            print(
                f"round {rnd + 1}: CPU ms per request: httpx {hx:.3f}, aiohttp {ah:.3f}, "
                f"aiohttp as the gateway sets it up {gw:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
