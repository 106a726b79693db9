"""Gateway-side commands of `turnstile`: serve, sessions, export.

`sessions` and `export` read the database directly, so they work on a finished run
without a gateway running.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from gateway.config import PROMPT_MODES, GatewayConfig


# choices a flag takes, from the registries (loaded only when the parser is built)
def _choices(name: str) -> list[str] | None:
    if name == "engine":
        from gateway.inference.registry import INFERENCE_ENGINES

        return sorted(INFERENCE_ENGINES)
    if name == "tool_parser":
        from gateway.chat.families import TOOL_PARSERS

        return ["auto", *sorted(TOOL_PARSERS)]
    if name == "reasoning_parser":
        from gateway.chat.families import REASONING_PARSERS

        return ["auto", "none", *sorted(REASONING_PARSERS)]
    if name == "prompt_mode":
        return list(PROMPT_MODES)
    return None


SERVE_DEFAULTS = {"port": 8000, "database": "turnstile.db"}  # `serve` is a long-lived server


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """One flag per GatewayConfig field, with the field's help (and its former name's
    flag as a second spelling)."""
    defaults = GatewayConfig()
    for f in fields(GatewayConfig):
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        default = SERVE_DEFAULTS.get(f.name, getattr(defaults, f.name))
        kwargs: dict = {"dest": f.name, "help": f.metadata["help"], "choices": _choices(f.name)}
        if isinstance(default, list):
            kwargs.update(action="append", default=[])
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            kwargs.update(type=type(default), default=default)
        else:
            kwargs.update(default=default)
        old = f.metadata.get("old")
        p.add_argument(flag, *(["--" + old.replace("_", "-")] if old else []), **kwargs)


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from gateway.server import serve_forever

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = GatewayConfig(**{f.name: getattr(args, f.name) for f in fields(GatewayConfig)})
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
    p.add_argument(
        "--include-side-requests",
        action="store_true",
        help="also export clients' side requests (e.g. Claude Code's title generation)",
    )
    p.add_argument("--limit", type=int, default=100000)


def cmd_export(args: argparse.Namespace) -> int:
    from gateway.samples import NoRewardError, export_session

    repo = _repo(args.database)
    written = skipped = 0
    with open(args.out, "w") as f:
        for s in repo.list_sessions(limit=args.limit):
            try:
                samples = export_session(
                    s["id"],
                    repo.completions(s["id"]),
                    args.style,
                    args.turn_discount,
                    args.include_side_requests,
                )
            except NoRewardError:
                skipped += 1
                continue
            for sample in samples:
                f.write(json.dumps(sample.to_dict()) + "\n")
                written += 1
    print(f"wrote {written} samples to {args.out}; skipped {skipped} sessions with no reward")
    return 0
