"""OpenAI Agents SDK `Runner` with a function tool, over Chat Completions or Responses.

Modes: `chat` and `chat-stream` use `OpenAIChatCompletionsModel`; `responses` and
`responses-stream` use `OpenAIResponsesModel` (the SDK's default API).
"""

from __future__ import annotations

import asyncio
from typing import Any

from _common import MODEL, QUESTION, SYSTEM, arguments_dict, emit, get_weather, parse_args
from openai import AsyncOpenAI

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)

MODES = ["chat", "chat-stream", "responses", "responses-stream"]

# Tracing would upload spans to api.openai.com.
set_tracing_disabled(True)


@function_tool(name_override="get_weather")
def weather_tool(city: str) -> str:
    """Current weather of a city.

    Args:
        city: The city.
    """
    return get_weather(city)


def response_id(raw: Any) -> str | None:
    """The id of one model call, where the SDK shows it.

    The Responses API model reports the response id. The Chat Completions model leaves
    it None and keeps the completion's id in its output items' provider data, except
    when streaming, where the SDK stamps placeholders (`__fake_id__`) instead.
    """
    candidates = [raw.response_id]
    for item in raw.output:
        data = getattr(item, "provider_data", None) or (item.model_extra or {}).get("provider_data")
        if isinstance(data, dict):
            candidates.append(data.get("response_id"))
    return next((c for c in candidates if c and not c.startswith("__fake")), None)


async def run(args: Any) -> dict[str, Any]:
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    if args.mode.startswith("chat"):
        model: Any = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    else:
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
    agent = Agent(
        name="weather",
        instructions=SYSTEM,
        model=model,
        tools=[weather_tool],
        model_settings=ModelSettings(temperature=0.0),
    )
    events: list[str] = []
    if args.mode.endswith("stream"):
        result: Any = Runner.run_streamed(agent, QUESTION)
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type not in events:
                events.append(event.data.type)
    else:
        result = await Runner.run(agent, QUESTION)
    calls = [item.raw_item for item in result.new_items if item.type == "tool_call_item"]
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    return {
        "completion_ids": [response_id(r) for r in result.raw_responses],
        "tool_calls": [
            {
                "id": c.call_id,
                "type": "function",
                "name": c.name,
                "arguments": arguments_dict(c.arguments),
            }
            for c in calls
        ],
        "tool_call_outputs": [
            {"call_id": o.raw_item["call_id"], "output": o.output} for o in outputs
        ],
        "final_text": result.final_output,
        "stream_event_types": events,
        "num_model_calls": len(result.raw_responses),
    }


def main() -> None:
    args = parse_args(MODES)
    seen = asyncio.run(run(args))
    emit("agents", args.mode, ["openai-agents", "openai"], **seen)


if __name__ == "__main__":
    main()
