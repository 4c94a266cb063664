"""Calls on their own daemon thread, with the result (or error) in a `concurrent.futures.Future`.

A thread per call rather than a `ThreadPoolExecutor`: the executor's workers are joined at
interpreter exit, so one hung call (a tool, a dead sandbox connection) would keep the
process alive; a daemon thread is abandoned instead, and no call ever queues behind it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

__all__ = ["DeadlineExceeded", "call_with_deadline", "run_in_thread"]


class DeadlineExceeded(TimeoutError):
    """`call_with_deadline`'s call was still running at its deadline (it is left running)."""


def run_in_thread(fn: Callable[[], T], *, name: str) -> Future[T]:
    """Start `fn()` on a new daemon thread named `name`; return its future."""
    future: Future[T] = Future()
    future.set_running_or_notify_cancel()

    def target() -> None:
        try:
            result = fn()
        except BaseException as err:  # handed to whoever waits on the future
            future.set_exception(err)
        else:
            future.set_result(result)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def call_with_deadline(fn: Callable[[], T], timeout_s: float, *, name: str) -> T:
    """`fn()`'s result or error, or `DeadlineExceeded` once `timeout_s` passes (the call runs on)."""
    future = run_in_thread(fn, name=name)
    try:
        return future.result(timeout_s)
    except TimeoutError:
        if future.done():  # fn itself raised a TimeoutError
            raise
        raise DeadlineExceeded(f"{name} took longer than {timeout_s:g}s") from None
