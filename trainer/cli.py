"""The `turnstile` command: serve, sessions, export (gateway) and train (trainer)."""

from __future__ import annotations

import argparse
import logging
import sys

from gateway import cli as gateway_cli
from trainer.api.config import ConfigError, load_config


def cmd_train(args: argparse.Namespace) -> int:
    if args.help_config:
        from trainer.config_doc import as_text

        print(as_text())
        return 0
    from trainer.trainer import Trainer

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if args.time_budget is not None:
        config.time_budget_s = args.time_budget * 60
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
    for backend in config.tracker_backends():
        where = {"tensorboard": result.run_dir / "tensorboard", "wandb": result.run_dir / "wandb"}
        print(f"{backend:<17} {where.get(backend, 'its local store (trackio show)')}")
    print(f"policy version    {result.policy_version}")
    if result.start_step:
        print(f"resumed at step   {result.start_step}")
    print(
        f"mean reward: first steps {fmt(result.first_reward)} -> last steps {fmt(result.last_reward)}"
    )
    if result.stopped_early:
        print(f"time budget       reached: stopped at policy version {result.policy_version}")
    if result.wall_s:
        minutes, seconds = divmod(round(result.wall_s), 60)
        print(f"wall-clock        {minutes} min {seconds} s, start-up and evaluations included")
    if result.evals:
        print(f"held-out eval     {result.run_dir / 'eval.jsonl'}")
        for e in result.evals:
            print(f"  after {e['step']:>3} steps: {_eval_line(e)}")
        first, last = result.evals[0], result.evals[-1]
        if len(result.evals) > 1:
            gain = last["accuracy"] - first["accuracy"]
            separate = last["accuracy_ci"][0] > first["accuracy_ci"][1]
            verdict = "the 95% intervals do not overlap" if separate else "the intervals overlap"
            print(f"held-out accuracy {gain:+.3f} ({verdict})")
    return 0


def _eval_line(e: dict) -> str:
    lo, hi = e["accuracy_ci"]
    rlo, rhi = e["reward_ci"]
    return (
        f"accuracy {e['accuracy']:.3f} [{lo:.3f}, {hi:.3f}], "
        f"mean reward {e['reward_mean']:.3f} [{rlo:.3f}, {rhi:.3f}] (n={e['n']})"
    )


def cmd_eval(args: argparse.Namespace) -> int:
    from trainer.trainer import Trainer

    logging.basicConfig(level=logging.WARNING)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    result = Trainer(config).evaluate(workflow=args.workflow, checkpoint=args.checkpoint)
    print(f"{args.checkpoint or 'base model'}: {_eval_line(result.to_dict())}")
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
    p.add_argument(
        "--help-config",
        action="store_true",
        help="print every config key, section by section, with its default and meaning",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        metavar="MIN",
        help="stop training in time for the final evaluation within MIN minutes "
        "(overrides time_budget_s)",
    )
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.lr=1e-6")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a model on the config's held-out set (greedy)")
    p.add_argument("--config", required=True, help="YAML config file (its `eval:` section)")
    p.add_argument("--checkpoint", help="a Hugging Face folder (default: the config's model)")
    p.add_argument("--workflow", help="overrides `workflow` in the config")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. eval.size=128")
    p.set_defaults(func=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
