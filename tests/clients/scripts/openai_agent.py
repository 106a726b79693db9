"""The official `openai` SDK: a tool-calling conversation, sync, async or streamed."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from _common import (
    MODEL,
    QUESTION,
    SYSTEM,
    WEATHER_TOOL,
    arguments_dict,
    emit,
    get_weather,
    parse_args,
)

MODES = ["sync", "async", "stream"]


def first_messages() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


def tool_turn(messages: list[dict[str, Any]], assistant: dict[str, Any]) -> None:
    """Append the assistant's tool calls and, for each, the tool's answer."""
    messages.append(assistant)
    for call in assistant["tool_calls"]:
        args = arguments_dict(call["function"]["arguments"])
        messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": get_weather(**args)}
        )


def run_sync(client: openai.OpenAI) -> dict[str, Any]:
    messages = first_messages()
    seen: dict[str, Any] = {"completion_ids": [], "finish_reasons": []}
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    seen["completion_ids"].append(first.id)
    seen["finish_reasons"].append(first.choices[0].finish_reason)
    message = first.choices[0].message
    seen["tool_calls"] = [tc.model_dump() for tc in message.tool_calls or []]
    tool_turn(messages, message.model_dump(exclude_none=True))
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    seen["completion_ids"].append(second.id)
    seen["finish_reasons"].append(second.choices[0].finish_reason)
    seen["final_text"] = second.choices[0].message.content
    return seen


async def run_async(client: openai.AsyncOpenAI) -> dict[str, Any]:
    messages = first_messages()
    seen: dict[str, Any] = {"completion_ids": [], "finish_reasons": []}
    first = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL]
    )
    seen["completion_ids"].append(first.id)
    seen["finish_reasons"].append(first.choices[0].finish_reason)
    message = first.choices[0].message
    seen["tool_calls"] = [tc.model_dump() for tc in message.tool_calls or []]
    tool_turn(messages, message.model_dump(exclude_none=True))
    second = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL]
    )
    seen["completion_ids"].append(second.id)
    seen["finish_reasons"].append(second.choices[0].finish_reason)
    seen["final_text"] = second.choices[0].message.content
    return seen


def stream_once(client: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed completion, put back together from its chunks as a client would."""
    ids: list[str] = []
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    first_deltas: list[dict[str, Any]] = []
    finish = None
    usage = None
    chunks = 0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        chunks += 1
        if chunk.id not in ids:
            ids.append(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            assert choice.index == 0, choice
            delta = choice.delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                if tc.index not in calls:
                    # The first delta of a call names it: id, type and function name.
                    first_deltas.append(tc.model_dump())
                    calls[tc.index] = {
                        "id": tc.id,
                        "type": tc.type,
                        "function": {"name": tc.function.name, "arguments": ""},
                    }
                calls[tc.index]["function"]["arguments"] += (
                    tc.function.arguments if tc.function and tc.function.arguments else ""
                )
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {
        "ids": ids,
        "message": message,
        "finish_reason": finish,
        "usage": usage,
        "chunks": chunks,
        "first_tool_call_deltas": first_deltas,
    }


def run_stream(client: openai.OpenAI) -> dict[str, Any]:
    messages = first_messages()
    first = stream_once(client, messages)
    tool_turn(messages, first["message"])
    second = stream_once(client, messages)
    return {
        # Every chunk of one completion carries the same id.
        "completion_ids": [*first["ids"], *second["ids"]],
        "finish_reasons": [first["finish_reason"], second["finish_reason"]],
        "tool_calls": first["message"].get("tool_calls", []),
        "final_text": second["message"]["content"],
        "first_tool_call_deltas": first["first_tool_call_deltas"],
        "usage": [first["usage"], second["usage"]],
        "chunks": [first["chunks"], second["chunks"]],
    }


def main() -> None:
    args = parse_args(MODES)
    kwargs = {"base_url": args.base_url, "api_key": args.api_key, "max_retries": 0}
    if args.mode == "sync":
        seen = run_sync(openai.OpenAI(**kwargs))
    elif args.mode == "async":
        seen = asyncio.run(run_async(openai.AsyncOpenAI(**kwargs)))
    else:
        seen = run_stream(openai.OpenAI(**kwargs))
    seen["tool_calls"] = [
        {
            "id": tc["id"],
            "type": tc["type"],
            "name": tc["function"]["name"],
            "arguments": tc["function"]["arguments"],
        }
        for tc in seen["tool_calls"]
    ]
    emit("openai", args.mode, ["openai"], **seen)


if __name__ == "__main__":
    main()
