"""The `trajlake` entry point: parse arguments, then import the heavy code a command needs.

Each stage registers its commands in its own `commands.py` (`register(subparsers)`), which
imports only argparse-level code and settings models, so `trajlake --help` stays instant. The
options are generated from the models (`trajlake.schemas.settings.add_settings`).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib
import os
import select
import sys
from collections.abc import Sequence

from trajlake.schemas.errors import TrajlakeError
from trajlake.schemas.settings import SettingsError, SettingsParser

COMMAND_MODULES = (
    "trajlake.store.commands",
    "trajlake.rollout.commands",
    "trajlake.rollout.engine.commands",
    "trajlake.ingest.commands",
    "trajlake.trainer.commands",
    "trajlake.dashboards.commands",
    "trajlake.demo.commands",
)


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


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The parser `main` uses, built once per process: building it reads no environment, and
    registering every command's settings takes 25 ms, which a caller of `main` pays once."""
    return build_parser()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (0 success, 1 failure, 2 usage or input error)."""
    parser = _parser()
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
    except BrokenPipeError:
        if not _stdout_is_closed():  # a socket's, not ours to hide
            raise
        return _drop_stdout()  # `trajlake sql ... | head`: the reader has what it wanted
    except KeyboardInterrupt:
        print(f"trajlake {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


def _stdout_is_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):
        return False
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _drop_stdout() -> int:
    """Point stdout at /dev/null so the interpreter's final flush into the closed pipe raises
    nothing; return 141, the shell's code for a command ended by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (a test's capture): nothing will flush into the pipe
        pass
    return 141


M_MXFAST = 1
"""glibc's `mallopt` parameter for the largest request its fastbins serve."""


def tune_malloc() -> bool:
    """Turn off glibc's fastbins in this process (`mallopt(M_MXFAST, 0)`); True if it did.

    The native code under a commit or a read (C++ and Rust objects) frees many small blocks;
    glibc parks them in fastbins, and a later large allocation first merges every one of them
    (`malloc_consolidate`): a stall of about 20 ms after each sink commit, on an 85 ms catch-up
    of 1,000 trajectories that took 60 ms without them. Without fastbins a block is merged as it
    is freed. A `GLIBC_TUNABLES` that sets `glibc.malloc.mxfast` is kept; on another C library
    (musl, macOS) there is nothing to tune.
    """
    if "glibc.malloc.mxfast" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MXFAST, 0))


def run() -> None:
    """Console-script entry: exit with `main`'s code. The process runs without glibc's
    fastbins (`tune_malloc`): a `trajlake` command may be a sink that runs for days."""
    tune_malloc()
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the last buffered lines met a closed pipe
        code = _drop_stdout()
    sys.stderr.flush()
    # deltalake's runtime threads can abort the interpreter while it tears down after a
    # clean run; the work is committed by now, so leave without running finalizers.
    os._exit(code)
