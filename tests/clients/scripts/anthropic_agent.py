"""The official `anthropic` SDK against the gateway's Messages API.

Modes: `create` (a tool round trip, whole answers, then count_tokens), `stream` (the
same, streamed through the SDK's `messages.stream` helper), `thinking` (a reasoning
model's thinking blocks, sent back on the next turn), `retry` (the gateway answers 529
overloaded first; the SDK retries). Prints one RESULT line with what the SDK saw.
"""

from __future__ import annotations

import argparse
import json
from importlib import metadata
from typing import Any

import anthropic

RESULT_PREFIX = "CLIENT-RESULT "
MODEL = "claude-sonnet-4-5"
QUESTION = "What is the weather in Paris?"
SYSTEM = "You are a weather assistant. Use the tools you are given."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city."}},
        "required": ["city"],
    },
}
TOOL_RESULTS: list[dict[str, Any]] = []


def get_weather(city: str) -> str:
    result = f"Sunny, 22 C in {city}."
    TOOL_RESULTS.append({"city": city, "result": result})
    return result


def tool_results(content: list[Any]) -> list[dict[str, Any]]:
    return [
        {"type": "tool_result", "tool_use_id": b.id, "content": get_weather(**b.input)}
        for b in content
        if b.type == "tool_use"
    ]


def run_tools(client: anthropic.Anthropic, stream: bool) -> dict[str, Any]:
    seen: dict[str, Any] = {"message_ids": [], "stop_reasons": [], "event_types": []}
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    kwargs = {"model": MODEL, "max_tokens": 1024, "system": SYSTEM, "tools": [WEATHER_TOOL]}

    def ask() -> Any:
        if not stream:
            return client.messages.create(messages=messages, **kwargs)
        with client.messages.stream(messages=messages, **kwargs) as s:
            for event in s:
                seen["event_types"].append(event.type)
            return s.get_final_message()

    first = ask()
    seen["message_ids"].append(first.id)
    seen["stop_reasons"].append(first.stop_reason)
    seen["usage"] = [first.usage.model_dump()]
    seen["tool_uses"] = [b.model_dump() for b in first.content if b.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": tool_results(first.content)},
    ]
    second = ask()
    seen["message_ids"].append(second.id)
    seen["stop_reasons"].append(second.stop_reason)
    seen["usage"].append(second.usage.model_dump())
    seen["final_text"] = "".join(b.text for b in second.content if b.type == "text")
    counted = client.messages.count_tokens(
        model=MODEL, messages=messages, system=SYSTEM, tools=[WEATHER_TOOL]
    )
    seen["count_tokens"] = counted.input_tokens
    return seen


def run_thinking(client: anthropic.Anthropic) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+2?"}]
    kwargs = {
        "model": MODEL,
        "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    with client.messages.stream(messages=messages, **kwargs) as s:
        first = s.get_final_message()
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": "Are you sure?"},
    ]
    second = client.messages.create(messages=messages, **kwargs)
    return {
        "message_ids": [first.id, second.id],
        "blocks": [[b.model_dump() for b in m.content] for m in (first, second)],
    }


def run_retry(client: anthropic.Anthropic) -> dict[str, Any]:
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
    )
    message = raw.parse()
    return {"message_ids": [message.id], "retries_taken": raw.retries_taken}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-url", required=True, help="the gateway, without /v1")
    p.add_argument("--api-key", required=True)
    p.add_argument("--mode", choices=["create", "stream", "thinking", "retry"], required=True)
    args = p.parse_args()
    # auth_token: `Authorization: Bearer`, as the SDK sends it for ANTHROPIC_AUTH_TOKEN
    client = anthropic.Anthropic(
        base_url=args.base_url, auth_token=args.api_key, api_key=None, max_retries=3
    )
    if args.mode in ("create", "stream"):
        seen = run_tools(client, args.mode == "stream")
    elif args.mode == "thinking":
        seen = run_thinking(client)
    else:
        seen = run_retry(client)
    seen.update(mode=args.mode, tool_results=TOOL_RESULTS)
    seen["versions"] = {"anthropic": metadata.version("anthropic")}
    print(RESULT_PREFIX + json.dumps(seen, default=str), flush=True)


if __name__ == "__main__":
    main()
