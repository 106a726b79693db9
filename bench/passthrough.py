"""The reference the gateway is measured against: a naive FastAPI + httpx proxy.

It forwards each chat completion to the engine's OpenAI endpoint and returns the answer,
recording nothing: the cost of the least a proxy in the agent's path can do, written
the obvious way (pydantic body, httpx upstream, dict response).

    python -m bench.passthrough --port 18101 --upstream http://127.0.0.1:18100
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[dict[str, Any]]


def make_app(upstream: str) -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(base_url=upstream, timeout=60)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> dict[str, Any]:
        r = await client.post("/v1/chat/completions", json=body.model_dump())
        return r.json()

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    args = p.parse_args(argv)
    app = make_app(args.upstream)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
