"""The `trajlake` entry point: parse arguments, then import the heavy code a command needs.

Each stage registers its commands in its own `commands.py` (`register(subparsers)`), which
imports only argparse-level code, so `trajlake --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trajlake.schemas.errors import TrajlakeError

COMMAND_MODULES = (
    "trajlake.store.commands",
    "trajlake.rollout.commands",
    "trajlake.rollout.engine.commands",
    "trajlake.ingest.commands",
    "trajlake.trainer.commands",
    "trajlake.dashboards.commands",
    "trajlake.demo.commands",
)

DEFAULT_LAKE = "./trajlake-data"


class CliError(TrajlakeError):
    """A user-facing failure: printed to stderr without a traceback, exit code 2."""


def env_default(name: str, default: str | None = None) -> str | None:
    """The value of `TRAJLAKE_<NAME>` if set and not empty, else `default`.

    For an option with `type=int` or `float` this stays a string: argparse converts it, and
    reports a bad value, only when that command runs, so one bad variable breaks no other command.
    """
    return os.environ.get(f"TRAJLAKE_{name}") or default


def add_kafka_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--kafka HOST:PORT` (env TRAJLAKE_KAFKA): the bootstrap servers; `help` says what it switches."""
    parser.add_argument("--kafka", default=env_default("KAFKA"), metavar="HOST:PORT", help=help)


def add_lake_option(parser: argparse.ArgumentParser) -> None:
    """`--lake D` (env TRAJLAKE_LAKE, default ./trajlake-data)."""
    parser.add_argument(
        "--lake",
        default=env_default("LAKE", DEFAULT_LAKE),
        help="lake root: a directory or s3://bucket/prefix (env TRAJLAKE_LAKE; default %(default)s)",
    )


def settings_error(err: Any, where: Mapping[str, str] | None = None) -> str:
    """A pydantic `ValidationError` as one line: each bad setting, what is wrong, what it got, and
    (from `where`: field -> the options that set it) where to change it."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        if not loc:  # a check across several fields: its message names them
            parts.append(msg)
            continue
        fix = f"; set {where[loc]}" if where and loc in where else ""
        parts.append(f"{loc}: {msg} (got {e.get('input')!r}){fix}")
    return "; ".join(parts)


def add_run_option(parser: argparse.ArgumentParser, help: str = "run id (env TRAJLAKE_RUN)") -> None:
    """`--run R` (env TRAJLAKE_RUN), required unless the env var is set."""
    parser.add_argument("--run", default=env_default("RUN"), required=env_default("RUN") is None, help=help)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every stage's commands registered."""
    parser = argparse.ArgumentParser(
        prog="trajlake",
        description="Event-sourced trajectory lakehouse for agent RL.",
    )
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # the stage has no commands yet
                continue
            raise
        module.register(subparsers)
    return parser


def _version() -> str:
    from trajlake import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (0 success, 1 failure, 2 usage or input error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        code = args.handler(args)
    except TrajlakeError as err:
        print(f"trajlake {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trajlake {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


def run() -> None:
    """Console-script entry: exit with `main`'s code."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # deltalake's runtime threads can abort the interpreter while it tears down after a
    # clean run; the work is committed by now, so leave without running finalizers.
    os._exit(code)
