"""One retry policy for every layer: exponential backoff with jitter, on tenacity.

Every retrying site (the lake's fenced commits, projection catch-up, the Kafka spool, the
broker's readiness wait, the TITO client, the judge) builds its loop here, so attempts,
delays, `Retry-After` and cancellation mean the same thing everywhere:

    for attempt in retrying(config.retry, retry_on=is_transient):
        with attempt:
            send()

The loop re-raises the last error once attempts (or the deadline) run out; a result-based
loop (`retry_on_result`) that runs out raises `RetryError`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import tenacity
from tenacity import RetryCallState, RetryError

__all__ = [
    "Backoff",
    "BackoffPolicy",
    "RetryError",
    "backoff_delay",
    "retry_after_s",
    "retrying",
    "retrying_async",
    "wait_until",
]


class Backoff(Protocol):
    """What a retry policy says (the fields of `trajlake.rollout.config.RetryConfig`)."""

    @property
    def max_attempts(self) -> int: ...
    @property
    def initial_backoff_s(self) -> float: ...
    @property
    def max_backoff_s(self) -> float: ...
    @property
    def multiplier(self) -> float: ...
    @property
    def jitter(self) -> float: ...


@dataclass(frozen=True)
class BackoffPolicy:
    """A retry policy fixed in code, for sites that have no user-facing retry settings."""

    max_attempts: int
    initial_backoff_s: float
    max_backoff_s: float
    multiplier: float = 2.0
    jitter: float = 1.0


def backoff_delay(retry: int, policy: Backoff, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number `retry` (1 = the first retry)."""
    ceiling = min(policy.max_backoff_s, policy.initial_backoff_s * policy.multiplier ** (retry - 1))
    jittered = (rng or random).uniform(0, ceiling * policy.jitter)
    return ceiling * (1 - policy.jitter) + jittered


def retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (the HTTP-date form is ignored)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class _WaitBackoff(tenacity.wait.wait_base):
    """`backoff_delay` per attempt, unless the failed attempt's error carries `retry_after_s`."""

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None and outcome.failed else None
        hinted = getattr(error, "retry_after_s", None)
        if hinted is not None:  # the server said when to come back (429/503 Retry-After)
            return float(hinted)
        return backoff_delay(retry_state.attempt_number, self.policy)


class _WaitAfter(tenacity.wait.wait_base):
    """Seconds from a function of the failed attempt's number (1 = the first attempt)."""

    def __init__(self, delay: Callable[[int], float]) -> None:
        self.delay = delay

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.delay(retry_state.attempt_number)


Predicate = Callable[[BaseException], bool]
Wait = float | Callable[[int], float]
"""Fixed seconds between attempts, or seconds after failed attempt number n."""


def _kwargs(
    policy: Backoff | None,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | Predicate,
    retry_on_result: Callable[[Any], bool] | None,
    attempts: int | None,
    deadline_s: float | None,
    wait: Wait | None,
) -> dict[str, Any]:
    stops: list[tenacity.stop.stop_base] = []
    max_attempts = attempts if attempts is not None else policy.max_attempts if policy else None
    if max_attempts is not None:
        stops.append(tenacity.stop_after_attempt(max_attempts))
    if deadline_s is not None:
        stops.append(tenacity.stop_after_delay(deadline_s))
    if isinstance(retry_on, type | tuple):
        condition: Any = tenacity.retry_if_exception_type(retry_on)
    else:
        condition = tenacity.retry_if_exception(retry_on)
    if retry_on_result is not None:
        condition = condition | tenacity.retry_if_result(retry_on_result)
    strategy: tenacity.wait.wait_base
    if wait is None:
        strategy = _WaitBackoff(policy) if policy is not None else tenacity.wait_none()
    elif isinstance(wait, int | float):
        strategy = tenacity.wait_fixed(wait)
    else:
        strategy = _WaitAfter(wait)
    return {
        "stop": tenacity.stop_any(*stops) if stops else tenacity.stop_never,
        "wait": strategy,
        "retry": condition,
        "reraise": True,
    }


def retrying(
    policy: Backoff | None = None,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | Predicate = Exception,
    retry_on_result: Callable[[Any], bool] | None = None,
    attempts: int | None = None,
    deadline_s: float | None = None,
    wait: Wait | None = None,
    cancel: threading.Event | None = None,
    cancelled: Callable[[], BaseException] | None = None,
) -> tenacity.Retrying:
    """A blocking retry loop (`for attempt in retrying(...): with attempt: ...`).

    Args:
        policy: attempts and backoff; delays follow `backoff_delay`, or an error's `retry_after_s`.
        retry_on: the error types (or a predicate) worth another attempt; anything else propagates.
        retry_on_result: retry while this is true of the attempt's return value.
        attempts: attempts in all, overriding `policy.max_attempts`.
        deadline_s: stop retrying once this many seconds have passed since the first attempt.
        wait: fixed seconds, or seconds after failed attempt n, instead of the policy's backoff.
        cancel: an event that cuts a wait short; the loop then raises `cancelled()`.
        cancelled: the error raised on cancel (default `InterruptedError`).
    """
    kwargs = _kwargs(policy, retry_on, retry_on_result, attempts, deadline_s, wait)
    if cancel is not None:
        make_error = cancelled or (lambda: InterruptedError("cancelled while waiting to retry"))

        def sleep(seconds: float) -> None:
            if cancel.wait(seconds):
                raise make_error()

        kwargs["sleep"] = sleep
    return tenacity.Retrying(**kwargs)


def retrying_async(
    policy: Backoff | None = None,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | Predicate = Exception,
    retry_on_result: Callable[[Any], bool] | None = None,
    attempts: int | None = None,
    deadline_s: float | None = None,
    wait: Wait | None = None,
) -> tenacity.AsyncRetrying:
    """`retrying` for coroutines (`async for attempt in ...`); cancelling the task cancels the wait."""
    return tenacity.AsyncRetrying(**_kwargs(policy, retry_on, retry_on_result, attempts, deadline_s, wait))


def wait_until(
    ready: Callable[[], bool],
    *,
    timeout_s: float,
    interval_s: float,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
) -> bool:
    """Call `ready` every `interval_s` until it returns True (then True) or `timeout_s` passes (False).

    `ready` runs at least once; errors of the `retry_on` types count as "not yet", any
    other propagates. The last wait is cut to the time left.
    """
    deadline = time.monotonic() + timeout_s
    loop = retrying(
        retry_on=retry_on,
        retry_on_result=lambda done: not done,
        deadline_s=timeout_s,
        wait=lambda _: min(interval_s, max(0.0, deadline - time.monotonic())),
    )
    try:
        return bool(loop(ready))
    except RetryError:
        return False
    except retry_on:
        return False
