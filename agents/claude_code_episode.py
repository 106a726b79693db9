"""Claude Code (the CLI bundled in `claude-agent-sdk`) against the gateway, offline.

Run inside `unshare -n` (as root): the namespace has only its own loopback, brought up
here, so nothing the CLI tries can leave the machine; nonessential traffic is off too.
The gateway is reached through a Unix socket relayed to 127.0.0.1:<port> (claude_code_relay.py).

One task with `tools=["Bash"]` (the prompt then fits a small model's context). Prints
one RESULT line: the tool calls and results the SDK saw, and the final result.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import socket
import struct
import sys
from dataclasses import asdict
from importlib import metadata
from typing import Any

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ResultMessage,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
    query,
)
from claude_code_relay import tcp_to_unix

RESULT_PREFIX = "CLIENT-RESULT "
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
MODEL = "claude-sonnet-4-5"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--socket", required=True, help="Unix socket relayed to the gateway")
    p.add_argument("--port", type=int, default=8765, help="loopback port inside the namespace")
    p.add_argument("--api-key", required=True, help="the session's key")
    p.add_argument("--workdir", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument(
        "--answers",
        type=int,
        default=0,
        help="stop after this many assistant messages (0: when Claude Code is done); "
        "a model that hits max_tokens otherwise gets Claude Code's continuation requests",
    )
    return p.parse_args()


def loopback_only() -> None:
    """Bring up this namespace's loopback (an ioctl, as `ip link set lo up` does), and
    make sure it is the only interface there is."""
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        sys.exit(f"not in a loopback-only network namespace: {names}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    options = ClaudeAgentOptions(
        tools=["Bash"],
        allowed_tools=["Bash"],  # pre-approved (bypassPermissions is refused as root)
        model=MODEL,
        max_turns=args.max_turns,
        cwd=args.workdir,
        env={
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{args.port}",
            "ANTHROPIC_API_KEY": args.api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "HOME": args.workdir,
        },
        stderr=lambda line: print(f"[claude] {line}", file=sys.stderr),
    )
    seen: dict[str, Any] = {
        "tool_uses": [], "tool_results": [], "texts": [], "models": [], "stop_reasons": []
    }  # fmt: skip
    relay = await tcp_to_unix(args.port, args.socket)  # the gateway, as the CLI reaches it
    try:
        async for message in query(prompt=args.prompt, options=options):
            if isinstance(message, AssistantMessage):
                seen["models"].append(message.model)
                seen["stop_reasons"].append(message.stop_reason)
                for block in message.content:
                    if isinstance(block, ToolUseBlock):
                        seen["tool_uses"].append(asdict(block))
                    elif isinstance(block, TextBlock):
                        seen["texts"].append(block.text)
                if args.answers and len(seen["models"]) >= args.answers:
                    break  # (closing the query ends the CLI)
            elif isinstance(message, UserMessage) and isinstance(message.content, list):
                for block in message.content:
                    if isinstance(block, ToolResultBlock):
                        seen["tool_results"].append(asdict(block))
            elif isinstance(message, ResultMessage):
                seen["result"] = {
                    "subtype": message.subtype,
                    "is_error": message.is_error,
                    "num_turns": message.num_turns,
                    "result": message.result,
                }
    finally:
        relay.close()
    return seen


def main() -> None:
    args = parse_args()
    loopback_only()
    os.makedirs(args.workdir, exist_ok=True)
    seen = asyncio.run(run(args))
    seen["versions"] = {"claude-agent-sdk": metadata.version("claude-agent-sdk")}
    print(RESULT_PREFIX + json.dumps(seen, default=str), flush=True)


if __name__ == "__main__":
    main()
