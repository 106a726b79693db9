"""Gateway-side commands of `turnstile`: serve, sessions, export.

`sessions` and `export` read the database directly, so they work on a finished run
without a gateway running.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.config import GatewayConfig


def add_serve_args(p: argparse.ArgumentParser) -> None:
    d = GatewayConfig()
    p.add_argument(
        "--host", default=d.host, help="address to bind (non-loopback needs --admin-key)"
    )
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--database", default="turnstile.db", help="SQLite file path or SQLAlchemy URL")
    p.add_argument(
        "--admin-key", default=d.admin_key, help="admin key (default: $TURNSTILE_ADMIN_KEY)"
    )
    from gateway.inference.registry import INFERENCE_ENGINES

    p.add_argument(
        "--engine",
        default=d.engine,
        choices=sorted(INFERENCE_ENGINES),
        help="; ".join(f"{s.name}: {s.help}" for s in INFERENCE_ENGINES.values()),
    )
    p.add_argument(
        "--model",
        default=None,
        help="local HF folder (default: bundled SmolLM2-135M-Instruct); with --engine sglang, "
        "the tokenizer and chat template of the model the servers serve",
    )
    p.add_argument(
        "--engine-url",
        action="append",
        default=[],
        metavar="URL",
        help="sglang: an SGLang server or sglang-router (repeat for several servers: "
        "each session sticks to one)",
    )
    p.add_argument(
        "--engine-update-url",
        action="append",
        default=[],
        metavar="URL",
        help="sglang: a server that weight updates go to (repeatable; default: the "
        "--engine-url servers, or the workers an sglang-router lists)",
    )
    p.add_argument(
        "--engine-max-context",
        type=int,
        default=d.engine_max_context,
        metavar="TOKENS",
        help="sglang: context length to assume if the servers do not report theirs",
    )
    p.add_argument("--served-model-name", default=d.served_model_name)
    p.add_argument("--device", default=d.device)
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size)
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, metavar="S")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-pending-requests", type=int, default=d.max_pending_requests)
    p.add_argument("--max-n", type=int, default=d.max_n)
    from gateway.chat.tool_parsers import TOOL_PARSERS

    p.add_argument(
        "--tool-parser",
        default=d.tool_parser,
        choices=["auto", *sorted(TOOL_PARSERS)],
        help="tool-call format to parse (auto: from the model's chat template)",
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from gateway.server import serve_forever

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = GatewayConfig(
        host=args.host,
        port=args.port,
        database=args.database,
        admin_key=args.admin_key,
        engine=args.engine,
        model=args.model,
        engine_urls=list(args.engine_url),
        engine_update_urls=list(args.engine_update_url),
        engine_max_context=args.engine_max_context,
        served_model_name=args.served_model_name,
        device=args.device,
        max_batch_size=args.max_batch_size,
        default_max_tokens=args.default_max_tokens,
        request_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        max_pending_requests=args.max_pending_requests,
        max_n=args.max_n,
        tool_parser=args.tool_parser,
    )
    from gateway.inference.registry import make_inference_engine

    try:  # a configuration the engine cannot start from is the user's error
        engine = make_inference_engine(cfg)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    serve_forever(cfg, engine)
    return 0


def _repo(database: str):  # -> Repository
    from gateway.store.database import database_url, open_database
    from gateway.store.repository import Repository

    url = database_url(database)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).is_file():
        raise SystemExit(f"no database at {database}")
    return Repository(open_database(url))


def add_sessions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database", required=True, help="SQLite file path or SQLAlchemy URL")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument(
        "--show", metavar="SESSION_ID", help="print one session with its completions as JSON"
    )


def cmd_sessions(args: argparse.Namespace) -> int:
    repo = _repo(args.database)
    if args.show:
        info = repo.session(args.show)
        if info is None:
            print(f"no session {args.show}", file=sys.stderr)
            return 1
        out = {
            "id": info.id,
            "ended_at": info.ended_at,
            "metadata": info.meta,
            "completions": repo.completions(args.show),
        }
        print(json.dumps(out, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"sessions in {args.database}")
    for col in ("id", "status", "completions", "rewarded", "metadata"):
        table.add_column(col)
    for s in repo.list_sessions(limit=args.limit):
        status = "ended" if s["ended_at"] else "open"
        table.add_row(
            s["id"],
            status,
            str(s["num_completions"]),
            str(s["num_rewarded"]),
            json.dumps(s["metadata"]),
        )
    Console().print(table)
    return 0


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database", required=True)
    p.add_argument("--out", required=True, help="JSONL file to write, one sample a line")
    from gateway.samples import EXPORT_STYLES

    p.add_argument("--style", default="individual", choices=sorted(EXPORT_STYLES))
    p.add_argument("--turn-discount", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=100000)


def cmd_export(args: argparse.Namespace) -> int:
    from gateway.samples import NoRewardError, export_session

    repo = _repo(args.database)
    written = skipped = 0
    with open(args.out, "w") as f:
        for s in repo.list_sessions(limit=args.limit):
            try:
                samples = export_session(
                    s["id"], repo.completions(s["id"]), args.style, args.turn_discount
                )
            except NoRewardError:
                skipped += 1
                continue
            for sample in samples:
                f.write(json.dumps(sample.to_dict()) + "\n")
                written += 1
    print(f"wrote {written} samples to {args.out}; skipped {skipped} sessions with no reward")
    return 0
