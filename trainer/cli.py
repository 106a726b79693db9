"""The `turnstile` command: serve, sessions, export (gateway) and train (trainer)."""

from __future__ import annotations

import argparse
import logging
import sys

from gateway import cli as gateway_cli


def cmd_train(args: argparse.Namespace) -> int:
    from trainer.config import ConfigError, load_config
    from trainer.trainer import Trainer

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    result = Trainer(config).train(workflow=args.workflow)
    from trainer.backend.distributed import is_main

    if not is_main():  # launched with torchrun / deepspeed: rank 0 reports
        return 0
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    print()
    print(f"run directory     {result.run_dir}")
    print(f"sessions database {result.database}")
    print(f"metrics           {result.metrics}")
    print(f"reward curve      {result.reward_curve}")
    print(f"checkpoint        {result.checkpoint}")
    print(f"tensorboard       {result.run_dir / 'tensorboard'}")
    print(f"policy version    {result.policy_version}")
    if result.start_step:
        print(f"resumed at step   {result.start_step}")
    print(
        f"mean reward: first steps {fmt(result.first_reward)} -> last steps {fmt(result.last_reward)}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnstile", description=__doc__)
    # the `deepspeed` launcher passes --local_rank=N ahead of the command; the rank also
    # arrives in $LOCAL_RANK, which is what the trainer reads
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway alone (data collection)")
    gateway_cli.add_serve_args(p)
    p.set_defaults(func=gateway_cli.cmd_serve)

    p = sub.add_parser("sessions", help="list recorded sessions, or show one")
    gateway_cli.add_sessions_args(p)
    p.set_defaults(func=gateway_cli.cmd_sessions)

    p = sub.add_parser("export", help="export recorded sessions as training samples (JSONL)")
    gateway_cli.add_export_args(p)
    p.set_defaults(func=gateway_cli.cmd_export)

    p = sub.add_parser("train", help="train a workflow from a YAML config")
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--workflow", help="overrides `workflow` in the config")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.lr=1e-6")
    p.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
