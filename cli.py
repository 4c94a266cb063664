"""The `trajlake` entry point: parse arguments, then import the heavy code a command needs.

Each stage registers its commands in its own `commands.py` (`register(subparsers)`), which
imports only argparse-level code and settings models, so `trajlake --help` stays instant. The
options are generated from the models (`trajlake.common.settings.add_settings`).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import functools
import importlib
import os
import select
import signal
import sys
from collections.abc import Iterator, Sequence

from trajlake.common.settings import SettingsError, SettingsParser, env_name
from trajlake.schemas.errors import CliError, TrajlakeError
from trajlake.schemas.settings import LakeSettings

COMMAND_MODULES = (
    "trajlake.store.commands",
    "trajlake.store.s3_commands",
    "trajlake.rollout.commands",
    "trajlake.rollout.engine.commands",
    "trajlake.ingest.commands",
    "trajlake.trainer.commands",
    "trajlake.dashboards.commands",
    "trajlake.demo.commands",
    "trajlake.deploy.commands",
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
    from trajlake.ingest import shutdown  # signal handlers only: nothing heavy

    try:
        access = getattr(args, "lake_access", None)  # declared by `uses_lake`
        if (unless := getattr(args, "lake_unless", None)) and getattr(args, unless, None):
            access = None
        if access in ("read", "update"):
            require_lake(parser, args.lake)
        if access in ("write", "update"):  # a read-only key is refused here, before anything is written
            require_safe_store(args.lake)
        # SIGINT/SIGTERM: what the command holds is flushed or spooled, and said (one mechanism for all)
        code = shutdown.run(lambda: args.handler(args), f"trajlake {args.command}")
    except TrajlakeError as err:
        print(f"trajlake {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if not _stdout_is_closed():  # a socket's, not ours to hide
            raise
        return _drop_stdout()  # `trajlake sql ... | head`: the reader has what it wanted
    return int(code or 0)


def commands(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command registered under `parser`, as ("import harbor", its parser), depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{path} {name}".strip(), sub
                yield from commands(sub, f"{path} {name}")


def require_lake(parser: argparse.ArgumentParser, root: str) -> None:
    """Refuse a reading command's `--lake` that holds no lake (a CliError naming the commands that
    write one), before the command runs: a mistyped path must not answer "0 rows" or leave a
    directory behind."""
    from trajlake.store.errors import LakeNotFound
    from trajlake.store.lake import Lake

    try:
        Lake(root, create=False)
    except LakeNotFound as err:
        writers = dict.fromkeys(
            f"`trajlake {name.split()[0]}{' …' if ' ' in name else ''}`"
            for name, sub in commands(parser)
            if sub.get_default("lake_access") == "write"
        )
        raise CliError(
            f"{err}; point --lake (or {env_name(LakeSettings, 'lake')}) at an existing lake, or write one there "
            f"first with {', '.join(writers)}, e.g. `trajlake loadgen --lake {root} --trajectories 200`"
        ) from None


def require_safe_store(root: str) -> None:
    """Refuse a writing command's object-store lake whose store would let two concurrent commits
    overwrite each other (`UnsafeStore`), before the command reads or writes anything."""
    if "://" in root and not root.startswith("file://"):
        from trajlake.store.put_if_absent import require_safe_store as require
        from trajlake.store.storage import Storage

        require(Storage(root))


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
    fastbins (`tune_malloc`): a `trajlake` command may be a sink that runs for days. `kill -USR1
    PID` prints every thread's stack to its stderr (where a stuck sink waits); registered here, on
    the process's own stderr, since a caller of `main` may have replaced sys.stderr with a stream
    that has no file descriptor (pytest's capture). The dump runs as a Python signal handler, with
    the interpreter's lock held: faulthandler's own C handler reads the other threads' frames while
    they run, and a busy sink died of it (SIGSEGV, seen in a full test run)."""
    tune_malloc()
    stderr = sys.__stderr__
    signal.signal(signal.SIGUSR1, lambda *_: faulthandler.dump_traceback(stderr, all_threads=True))
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the last buffered lines met a closed pipe
        code = _drop_stdout()
    sys.stderr.flush()
    # deltalake's runtime threads can abort the interpreter while it tears down after a
    # clean run; the work is committed by now, so leave without running finalizers.
    os._exit(code)
