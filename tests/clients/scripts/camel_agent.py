"""camel-ai `ChatAgent` with a `FunctionTool`: the agent runs the tool call loop itself."""

from __future__ import annotations

from typing import Any

from _common import MODEL, QUESTION, SYSTEM, emit, get_weather, parse_args
from camel.agents import ChatAgent
from camel.models import ModelFactory
from camel.toolkits import FunctionTool
from camel.types import ModelPlatformType
from camel.utils import BaseTokenCounter

MODES = ["step"]


class RoughTokenCounter(BaseTokenCounter):
    """Camel's default counter is tiktoken's, which downloads its vocabulary from the
    internet on first use. Context accounting does not matter here: count ~4 chars/token."""

    def count_tokens_from_messages(self, messages: list[Any]) -> int:
        return sum(len(str(m.get("content") or "")) // 4 + 4 for m in messages)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t) for t in token_ids)


def main() -> None:
    args = parse_args(MODES)
    model = ModelFactory.create(
        model_platform=ModelPlatformType.OPENAI_COMPATIBLE_MODEL,
        model_type=MODEL,
        url=args.base_url,
        api_key=args.api_key,
        token_counter=RoughTokenCounter(),
        max_retries=0,
        model_config_dict={"temperature": 0.0},
    )
    agent = ChatAgent(
        system_message=SYSTEM,
        model=model,
        tools=[FunctionTool(get_weather)],
        token_limit=8192,  # camel does not know the model "default"
    )
    response = agent.step(QUESTION)
    info = response.info
    emit(
        "camel",
        args.mode,
        ["camel-ai", "openai"],
        # Camel reports the id of the last completion only.
        completion_ids=[None, info.get("id")],
        finish_reasons=[None, *(info.get("termination_reasons") or [None])],
        tool_calls=[
            {"id": r.tool_call_id, "type": "function", "name": r.tool_name, "arguments": r.args}
            for r in info.get("tool_calls") or []
        ],
        tool_call_results=[r.result for r in info.get("tool_calls") or []],
        final_text=response.msgs[0].content if response.msgs else None,
        usage=info.get("usage"),
    )


if __name__ == "__main__":
    main()
