"""The floor of the gateway's web stack: FastAPI on uvicorn, doing nothing else.

Same server stack and settings as `turnstile serve` (uvicorn, asyncio loop, HTTP/1.1
by h11 unless httptools is installed, no access log), one async route that validates
the body with a pydantic model and returns a fixed chat completion. What the gateway
costs above this is its own work: rendering, tokenising, linking, recording.

    python -m bench.fastapi_floor_server --port 18101
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from bench.fake_engine_server import REPLY

_ids = itertools.count()


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = "default"
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = None
    temperature: float | None = None


app = FastAPI()


@app.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-floor{next(_ids):012d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 7, "total_tokens": 7},
    }


@app.get("/healthz")
async def health() -> dict[str, str]:
    return {"status": "ok"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18101)
    args = p.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
