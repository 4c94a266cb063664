"""The `trajlake` entry point: parse arguments, then import the heavy code a command needs.

Each stage registers its commands in its own `commands.py` (`register(subparsers)`), which
imports only argparse-level code and settings models, so `trajlake --help` stays instant. The
options are generated from the models (`trajlake.schemas.settings.add_settings`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from trajlake.schemas.settings import DEFAULT_LAKE, SettingsError, SettingsParser, settings_error

__all__ = ["DEFAULT_LAKE", "CliError", "build_parser", "main", "settings_error"]

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


class CliError(TrajlakeError):
    """A user-facing failure: printed to stderr without a traceback, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every stage's commands registered."""
    parser = SettingsParser(
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
    try:
        args = parser.parse_args(argv)
    except SettingsError as err:  # a bad option or TRAJLAKE_* value of the command that runs
        print(err, file=sys.stderr)
        return 2
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
