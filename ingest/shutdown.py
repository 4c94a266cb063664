"""Stopping a producer on SIGINT or SIGTERM: what it holds is flushed or spooled in bounded time, and said.

A producing process holds data at any moment: open trajectories in a `Recorder`, messages a
Kafka producer has not had acknowledged, an in-process bus's messages its sink has not
committed. `install()` turns both signals into `StopRequested` (a `KeyboardInterrupt`, so an
`except Exception` does not swallow it). Each holder registers itself (`hold`) at a stage, and
`settle()` asks each one, upstream first, to flush or spool what it holds before one deadline
(`TRAJLAKE_STOP_TIMEOUT_S`), and returns what each did, one line per holder. Entry points
(every `trajlake` command, the examples) run through `run`, which settles and prints those
lines; a process that installed the handlers but never calls `run` settles at exit after a stop.

Work that must not be cut in the middle (recording one imported trajectory, one generated
trajectory, a drain) runs in `deferred()`: a signal that arrives there is raised when it ends.
A signal that arrives while the process is already stopping is noted, not raised: the flush
goes on to its deadline (SIGKILL abandons it).
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from pydantic import Field, ValidationError

from trajlake.common.settings import Settings, SettingsError, settings_error

RECORD, PUBLISH, COMMIT, CHECK = 0, 1, 2, 3
"""Holder stages, settled in this order: open trajectories are published before the bus that
carries them is flushed, which comes before the sink that commits them; CHECK only reports."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSettings(Settings):
    """How long a stopping producer may take to flush or spool what it holds."""

    stop_timeout_s: float = Field(
        20.0,
        gt=0,
        le=3600,
        validation_alias="TRAJLAKE_STOP_TIMEOUT_S",
        description="on SIGINT/SIGTERM, flush or spool what is held within this time (below a "
        "supervisor's kill grace period: Kubernetes waits 30 s)",
    )


class Holder(Protocol):
    """Something that holds produced data until it is flushed."""

    def settle(self, deadline: float) -> str | None:
        """Flush or spool what is held before `deadline` (time.monotonic); say what was done (None: nothing held)."""
        ...


class StopRequested(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the process flushes what it holds and stops."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by this signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


class _State:
    """The process's one stop: the signal received, whether it was raised, the registered holders."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stop: StopRequested | None = None
        self.raised = False  # the stop was raised (or is being handled): later signals are only noted
        self.depth = 0  # nesting of `deferred` blocks on the main thread
        self.holders: dict[int, tuple[int, int, weakref.ref[Any]]] = {}  # id -> (stage, order, ref)
        self.order = 0
        self.timeout_s = StopSettings.model_fields["stop_timeout_s"].default
        self.at_exit = False


_state = _State()


def hold(holder: Holder, stage: int) -> None:
    """Register `holder` (weakly) to be settled at `stage` when the process stops."""
    with _state.lock:
        _state.order += 1
        _state.holders[id(holder)] = (stage, _state.order, weakref.ref(holder))


def release(holder: object) -> None:
    """Forget `holder` (it was closed, or settled)."""
    with _state.lock:
        _state.holders.pop(id(holder), None)


def requested() -> StopRequested | None:
    """The stop a signal asked for, if one did."""
    return _state.stop


def _on_signal(signum: int, _frame: object) -> None:
    if _state.stop is None:
        _state.stop = StopRequested(signum)
        _settle_at_exit_once()
    elif _state.raised:
        print(
            f"trajlake: {signal.Signals(signum).name} while stopping: still flushing what is held "
            f"(at most {_state.timeout_s:g} s, TRAJLAKE_STOP_TIMEOUT_S; SIGKILL abandons it)",
            file=sys.stderr,
            flush=True,
        )
        return
    if _state.depth or _state.raised:
        return  # raised when the deferred block ends
    _state.raised = True
    raise _state.stop


def _is_default(handler: Any) -> bool:
    return handler in (signal.SIG_DFL, signal.default_int_handler, _on_signal, None)


def install() -> dict[int, Any]:
    """Turn SIGINT and SIGTERM into `StopRequested` (main thread only; a handler the program set
    itself is kept); return the handlers replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    try:
        _state.timeout_s = StopSettings.from_env().stop_timeout_s
    except ValidationError as err:
        raise SettingsError(settings_error(err)) from None
    replaced: dict[int, Any] = {}
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if _is_default(current) and current is not _on_signal:
            replaced[sig] = signal.signal(sig, _on_signal)
    if replaced:  # a mask inherited blocked (a parent's preexec, e.g. Ray's) would hold the stop back forever
        signal.pthread_sigmask(signal.SIG_UNBLOCK, list(replaced))
    return replaced


@contextmanager
def signals() -> Iterator[None]:
    """`install()` for the block, with a fresh stop state; the previous handlers come back after it,
    and a stop it handled is forgotten (nothing is left to settle at exit)."""
    _state.stop, _state.raised, _state.depth = None, False, 0
    replaced = install()
    try:
        yield
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
        _state.stop, _state.raised, _state.depth = None, False, 0


class deferred:  # a context manager, named like one
    """A block a stop signal does not cut: one that arrives inside is raised when the block ends."""

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            _state.depth += 1

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        _state.depth -= 1
        if exc_type is None and not _state.depth and _state.stop is not None and not _state.raised:
            _state.raised = True
            raise _state.stop


def settle(before: int | None = None) -> list[str]:
    """Settle every registered holder (of the stages before `before`, if given), upstream first,
    within the stop timeout; return what each did. A holder's failure is reported, not raised."""
    deadline = time.monotonic() + _state.timeout_s
    lines: list[str] = []
    _state.raised = True  # a signal from here on is only noted
    while True:
        with _state.lock:
            due = sorted(v for v in _state.holders.values() if before is None or v[0] < before)
            if not due:
                return lines
            _, order, ref = due[0]
            _state.holders = {k: v for k, v in _state.holders.items() if v[1] != order}
        holder = ref()
        if holder is None:
            continue
        try:
            line = holder.settle(deadline)
        except Exception as err:  # one holder that fails must not keep the others from flushing
            line = f"{type(holder).__name__} could not flush: {type(err).__name__}: {err}"
        if line:
            lines.append(line)


def settle_upstream(stage: int) -> list[str]:
    """During a stop, settle the holders upstream of `stage` (a holder closing carries their last data)."""
    return settle(before=stage) if _state.stop is not None else []


def report(name: str, stop: StopRequested, lines: list[str]) -> None:
    """Print what a stop did, one line each, on stderr."""
    print(f"{name}: stopped by {stop.name}", file=sys.stderr)
    for line in lines or ["nothing was held"]:
        print(f"{name}: {line}", file=sys.stderr)
    sys.stderr.flush()


def run(main: Callable[[], int | None], name: str) -> int:
    """Run an entry point's `main` with SIGINT/SIGTERM as a graceful stop; return its exit code
    (the shell's 128 + signal after a stop that `main` did not handle itself)."""
    with signals():
        try:
            return int(main() or 0)
        except KeyboardInterrupt as err:
            stop = err if isinstance(err, StopRequested) else StopRequested(signal.SIGINT)
            _state.stop = _state.stop or stop
            report(name, stop, settle())
            return stop.exit_code


def _settle_at_exit_once() -> None:
    """After the first stop signal: settle at exit what no `run` settled (a program that uses a
    Recorder directly). It runs among threading's exit calls, registered last so it runs first:
    before `concurrent.futures` stops taking work, which a sink's commit still needs."""
    if _state.at_exit:
        return
    _state.at_exit = True
    register = getattr(threading, "_register_atexit", atexit.register)
    with contextlib.suppress(RuntimeError):  # already shutting down: nothing can run any more
        register(_settle_at_exit)


def _settle_at_exit() -> None:
    if _state.stop is not None and _state.holders:
        report("trajlake", _state.stop, settle())
