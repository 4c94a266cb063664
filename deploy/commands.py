"""CLI commands of the local deployment: `stack up`, `stack status`, `stack down`."""

from __future__ import annotations

import argparse
import logging

from trajlake.common.settings import add_settings, group_usage
from trajlake.deploy.config import StackConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `stack up|status|down`."""
    stack = subparsers.add_parser(
        "stack",
        help="the whole deployment as local processes: Kafka, SeaweedFS, PostgreSQL, sinks, projector, dashboard",
    )
    actions = stack.add_subparsers(dest="stack_command", metavar="ACTION")
    up = actions.add_parser(
        "up",
        help="start every part not running, each with its data dir under --dir, and wait until each answers; "
        "print the environment a producer and a SQL user need as NAME=value lines (the reader's: its S3 key "
        "and catalog role read only, Kafka's producer principal); the writer's (projector, trainers) is in "
        "DIR/env/writer.env, the sinks' in DIR/env/sink.env",
    )
    add_settings(up, StackConfig)
    up.set_defaults(handler=run_stack_up)
    status = actions.add_parser(
        "status", help="each part of the stack in --dir: running, and answering a probe"
    )
    add_settings(status, StackConfig, ["dir"])
    status.set_defaults(handler=run_stack_status)
    down = actions.add_parser("down", help="stop exactly what `stack up` started in --dir (the data stays)")
    add_settings(down, StackConfig, ["dir"])
    down.set_defaults(handler=run_stack_down)
    stack.set_defaults(handler=group_usage(stack))


def run_stack_up(args: argparse.Namespace) -> int:
    """Start the stack; print its clients' environment."""
    from trajlake.deploy.config import READER, WRITER
    from trajlake.deploy.credentials import ENV_DIR
    from trajlake.deploy.stack import up
    from trajlake.schemas.errors import CliError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the readiness probes' requests
    try:
        stack = up(args.StackConfig)
    except (OSError, RuntimeError) as err:  # a part that did not start names its log
        raise CliError(str(err)) from None
    dashboard = next(p.url for p in stack.processes if p.name == "dashboard")
    logging.getLogger(__name__).info(
        "stack up in %s; dashboard on %s; below: the reader's environment (reads the lake and the "
        "catalog, produces to Kafka as trajlake-producer); a writer's (trainers, compaction): %s",
        stack.dir, dashboard, stack.dir / ENV_DIR / f"{WRITER}.env",
    )  # fmt: skip
    for name, value in stack.envs[READER].items():
        print(f"{name}={value}")
    return 0


def run_stack_status(args: argparse.Namespace) -> int:
    """Print each part's health; exit 0 when every part is healthy, 1 otherwise."""
    from trajlake.deploy.health import stack_health
    from trajlake.deploy.stack import Stack

    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    stack = Stack.load(args.StackConfig.dir)
    if stack is None:
        print(f"no stack in {args.StackConfig.dir}")
        return 1
    parts = stack_health(stack)
    for part in parts:
        print(f"{part.name:<10} {'ok' if part.ok else 'DOWN':<5} {part.detail}")
    return 0 if all(p.ok for p in parts) else 1


def run_stack_down(args: argparse.Namespace) -> int:
    """Stop what the stack started; say what was running."""
    from trajlake.deploy.stack import down

    stopped = down(args.StackConfig.dir)
    print(
        f"stopped: {', '.join(stopped)}"
        if stopped
        else f"nothing of a stack running in {args.StackConfig.dir}"
    )
    return 0
