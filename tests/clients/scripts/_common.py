"""Shared by the client scripts. Runs inside each client's own virtualenv: stdlib only.

Every script holds the same conversation: the user asks for the weather in Paris, the
model calls `get_weather(city)`, the script runs it and sends the result back with the
call's id, and the model answers in text. The script prints one JSON line, prefixed by
RESULT_PREFIX, with what the client saw; the test compares it with the gateway's record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata
from typing import Any

RESULT_PREFIX = "CLIENT-RESULT "
MODEL = "default"
QUESTION = "What is the weather in Paris?"
SYSTEM = "You are a weather assistant. Use the tools you are given."

# The tool, in the OpenAI Chat Completions format, for clients that take raw schemas.
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}

TOOL_RESULTS: list[dict[str, Any]] = []


def get_weather(city: str) -> str:
    """Current weather of a city.

    Args:
        city: The city.
    """
    result = f"Sunny, 22 C in {city}."
    TOOL_RESULTS.append({"city": city, "result": result})
    return result


def parse_args(modes: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", required=True, help="the gateway, ending in /v1")
    parser.add_argument("--api-key", required=True, help="the session's API key")
    parser.add_argument("--mode", choices=modes, default=modes[0])
    args = parser.parse_args()
    # Clients that read the environment must see the gateway too, never api.openai.com.
    os.environ["OPENAI_BASE_URL"] = args.base_url
    os.environ["OPENAI_API_KEY"] = args.api_key
    return args


def arguments_dict(arguments: Any) -> Any:
    """Tool arguments as a dict, whether the client gives a JSON string or a dict."""
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def emit(client: str, mode: str, packages: list[str], **seen: Any) -> None:
    """Print what the client saw as one JSON line and exit."""
    versions = {p: metadata.version(p) for p in packages}
    record = {"client": client, "mode": mode, "versions": versions, **seen}
    record.setdefault("tool_results", TOOL_RESULTS)
    print(RESULT_PREFIX + json.dumps(record, default=str), flush=True)
    sys.stdout.flush()
