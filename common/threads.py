"""Threads: calls on their own daemon thread, and lazy imports and loads that any thread may make.

A thread per call rather than a `ThreadPoolExecutor`: the executor's workers are joined at
interpreter exit, so one hung call (a tool, a dead sandbox connection) would keep the
process alive; a daemon thread is abandoned instead, and no call ever queues behind it.

Code that DuckDB's UDF threads, rollout threads or Streamlit's script threads run imports heavy
libraries lazily and caches what it loads: the import goes inside `importing()`, the cache is
`once_per_key` (each key loaded once, however many threads ask for it at the same time).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from typing import Generic, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

__all__ = [
    "DeadlineExceeded",
    "OncePerKey",
    "call_with_deadline",
    "importing",
    "once_per_key",
    "run_in_thread",
]


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


_IMPORTS = threading.RLock()


@contextlib.contextmanager
def importing() -> Iterator[None]:
    """Hold the process's one lock for lazy imports, and for first uses of a library that imports
    more on demand (transformers' `from_pretrained` imports the tokenizer's module).

    Two threads whose imports wait on each other get, from Python's per-module import locks, one
    partially initialised module; transformers resolves `AutoTokenizer` on first access. Both at
    once on DuckDB's UDF threads gave `module 'transformers' has no attribute 'AutoTokenizer'`.
    """
    with _IMPORTS:
        yield


class OncePerKey(Generic[P, T]):
    """`fn` cached per arguments, each key loaded once: a caller of a key being loaded waits for
    that load instead of starting its own. An error is not cached (the next caller tries again);
    past `maxsize` keys the least recently used is dropped."""

    def __init__(self, fn: Callable[P, T], maxsize: int) -> None:
        self.fn, self.maxsize = fn, maxsize
        self.__doc__, self.__wrapped__ = fn.__doc__, fn
        self._lock = threading.Lock()
        self._values: OrderedDict[Hashable, T] = OrderedDict()
        self._loading: dict[Hashable, threading.Lock] = {}

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        key = (args, tuple(sorted(kwargs.items())))
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._lock:
                if key in self._values:  # loaded by the caller this one waited for
                    return self._values[key]
            try:
                value = self.fn(*args, **kwargs)
            except BaseException:
                with self._lock:
                    self._loading.pop(key, None)
                raise
            with self._lock:
                self._values[key] = value
                self._loading.pop(key, None)
                while len(self._values) > self.maxsize:
                    self._values.popitem(last=False)
            return value

    def cache_clear(self) -> None:
        """Forget every loaded value."""
        with self._lock:
            self._values.clear()


def once_per_key(maxsize: int = 128) -> Callable[[Callable[P, T]], OncePerKey[P, T]]:
    """Decorator: `OncePerKey(fn, maxsize)`, a thread-safe `functools.lru_cache` for loaders."""
    return lambda fn: OncePerKey(fn, maxsize)
