"""langchain-openai `ChatOpenAI`: a `bind_tools` round trip, with `invoke` or `stream`."""

from __future__ import annotations

from typing import Any

from _common import MODEL, QUESTION, SYSTEM, emit, get_weather, parse_args
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

MODES = ["invoke", "stream"]


@tool("get_weather")
def weather_tool(city: str) -> str:
    """Current weather of a city.

    Args:
        city: The city.
    """
    return get_weather(city)


def completion_id(message: AIMessage) -> str | None:
    """ChatOpenAI keeps the completion's id in the response metadata (and as message id)."""
    return message.response_metadata.get("id") or message.id


def ask(model: Any, messages: list[Any], mode: str) -> AIMessage:
    if mode == "invoke":
        return model.invoke(messages)
    merged = None
    for chunk in model.stream(messages):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None, "the stream was empty"
    return merged


def main() -> None:
    args = parse_args(MODES)
    llm = ChatOpenAI(
        model=MODEL,
        base_url=args.base_url,
        api_key=args.api_key,
        max_retries=0,
        stream_usage=True,
    )
    model = llm.bind_tools([weather_tool])
    messages: list[Any] = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
    first = ask(model, messages, args.mode)
    messages.append(first)
    for call in first.tool_calls:
        result = weather_tool.invoke(call["args"])
        messages.append(ToolMessage(content=result, tool_call_id=call["id"]))
    second = ask(model, messages, args.mode)
    emit(
        "langchain",
        args.mode,
        ["langchain-openai", "langchain-core", "openai"],
        completion_ids=[completion_id(first), completion_id(second)],
        finish_reasons=[
            first.response_metadata.get("finish_reason"),
            second.response_metadata.get("finish_reason"),
        ],
        tool_calls=[
            {"id": c["id"], "type": "function", "name": c["name"], "arguments": c["args"]}
            for c in first.tool_calls
        ],
        final_text=second.content,
        usage=[first.usage_metadata, second.usage_metadata],
    )


if __name__ == "__main__":
    main()
