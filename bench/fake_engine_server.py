"""An OpenAI-compatible "engine" that answers instantly: the baseline of the benchmark.

The agent calls it directly, without the gateway. It parses the request body (as any
server must) and answers one fixed small chat completion, the same text the gateway's
in-process `FakeEngine` produces, so both runs see the same conversations grow.

    python -m bench.fake_engine_server --port 18100
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

from aiohttp import web

REPLY = "The answer is 4."

_ids = itertools.count()


async def chat_completions(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    messages = body.get("messages") or []
    if not messages:
        return web.json_response(
            {"error": {"message": "messages is required", "type": "invalid_request_error"}},
            status=400,
        )
    prompt_tokens = sum(len(str(m.get("content") or "")) // 4 + 4 for m in messages)
    answer = {
        "id": f"chatcmpl-fake{next(_ids):012d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "default"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 7,
            "total_tokens": prompt_tokens + 7,
        },
    }
    return web.Response(body=json.dumps(answer).encode(), content_type="application/json")


async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/healthz", health)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18100)
    args = p.parse_args(argv)
    web.run_app(make_app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
