"""litellm `completion` through its `openai/` provider (any OpenAI-compatible server)."""

from __future__ import annotations

import os
from typing import Any

# litellm fetches its model price map from GitHub at import time unless told not to.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm  # noqa: E402
from _common import (  # noqa: E402
    MODEL,
    QUESTION,
    SYSTEM,
    WEATHER_TOOL,
    arguments_dict,
    emit,
    get_weather,
    parse_args,
)

MODES = ["sync", "stream"]


def ask(args: Any, messages: list[dict[str, Any]]) -> Any:
    kwargs = {
        # `openai/` = any OpenAI-compatible server at `api_base`, never api.openai.com.
        "model": f"openai/{MODEL}",
        "api_base": args.base_url,
        "api_key": args.api_key,
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "num_retries": 0,
    }
    if args.mode == "sync":
        return litellm.completion(**kwargs)
    chunks = list(litellm.completion(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks, "the stream was empty"
    response = litellm.stream_chunk_builder(chunks, messages=messages)
    response._stream_chunk_ids = list(dict.fromkeys(c.id for c in chunks))
    return response


def main() -> None:
    args = parse_args(MODES)
    litellm.telemetry = False
    litellm.suppress_debug_info = True
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    first = ask(args, messages)
    message = first.choices[0].message
    calls = [
        {
            "id": tc.id,
            "type": "function",
            "function": {"name": tc.function.name, "arguments": tc.function.arguments},
        }
        for tc in message.tool_calls or []
    ]
    messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
    for call in calls:
        result = get_weather(**arguments_dict(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    second = ask(args, messages)
    emit(
        "litellm",
        args.mode,
        ["litellm", "openai"],
        completion_ids=[first.id, second.id],
        stream_chunk_ids=[
            getattr(first, "_stream_chunk_ids", None),
            getattr(second, "_stream_chunk_ids", None),
        ],
        finish_reasons=[first.choices[0].finish_reason, second.choices[0].finish_reason],
        tool_calls=[
            {
                "id": c["id"],
                "type": c["type"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
            }
            for c in calls
        ],
        final_text=second.choices[0].message.content,
    )


if __name__ == "__main__":
    main()
