"""An inference engine that answers instantly, in its own process: the benchmarks' upstream.

The same answer (real SmolLM2 token ids ending in the stop token, so the gateway
detokenises real text) over SGLang's `POST /generate`, with output logprobs, and OpenAI's
`POST /v1/chat/completions`, with `logprobs.content` when asked. It parses every body, as
a real server must, and does nothing else.

    python -m bench.engine_server --port 18100 --ids 504,3365,... --text "..."
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence

from aiohttp import web

from bench.procs import Children, free_port

ANSWER = (
    "The list loses its last item because the loop stops one line early when the input "
    "ends with an empty line; iterate over"
)
_rids = itertools.count()


def answer_ids() -> list[int]:
    """The engine's answer as real SmolLM2 ids, ending in its stop token."""
    from gateway.inference.model_source import load_tokenizer, resolve_model_dir

    tok = load_tokenizer(resolve_model_dir())
    return tok.encode(ANSWER, add_special_tokens=False)[:31] + [int(tok.eos_token_id)]


def start(
    children: Children, ids: list[int] | None = None, text: str = ANSWER, prefix: Sequence[str] = ()
) -> str:
    """This engine as a child of the run, answering `ids` (by default ANSWER's) with the
    last as the stop token (`prefix`: e.g. a `taskset`); its URL, once ready."""
    ids, port = ids or answer_ids(), free_port()
    argv = [*prefix, sys.executable, "-m", "bench.engine_server", "--port", str(port),
            "--ids", ",".join(map(str, ids)), "--text", text]  # fmt: skip
    children.start("engine", argv, f"http://127.0.0.1:{port}/health")
    return f"http://127.0.0.1:{port}"


def make_app(ids: list[int], text: str) -> web.Application:
    logprobs = [-0.05 - (i % 7) * 0.01 for i in range(len(ids))]
    triples = [[lp, tok, None] for lp, tok in zip(logprobs, ids, strict=True)]

    async def generate(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        meta = {
            "id": f"bench{next(_rids)}",
            "finish_reason": {"type": "stop", "matched": ids[-1]},
            "prompt_tokens": len(body["input_ids"]),
            "weight_version": "0",
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "output_token_logprobs": triples if body.get("return_logprob") else None,
        }
        return web.json_response({"text": text, "output_ids": ids, "meta_info": meta})

    async def chat(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        content = None
        if body.get("logprobs"):
            content = [{"token": str(t), "logprob": lp, "top_logprobs": []}
                       for t, lp in zip(ids, logprobs, strict=True)]  # fmt: skip
        answer = {
            "id": f"chatcmpl-bench{next(_rids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "default"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": {"content": content} if content else None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(ids), "total_tokens": 0},
        }
        return web.json_response(answer)

    async def info(_: web.Request) -> web.Response:
        return web.json_response({"context_length": 65536, "weight_version": "0"})

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/chat/completions", chat)
    for path in ("/get_model_info", "/get_server_info"):
        app.router.add_get(path, info)
    app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    ids = "the answer's token ids, comma-separated, the stop token last"
    p.add_argument("--ids", required=True, help=ids)
    p.add_argument("--text", required=True, help="the answer's text")
    args = p.parse_args(argv)
    app = make_app([int(x) for x in args.ids.split(",")], args.text)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
