"""The shared retry policy: attempts, Retry-After, cancellation and deadlines mean one thing everywhere."""

from __future__ import annotations

import threading
import time

import pytest

from trajlake.common.retry import BackoffPolicy, backoff_delay, retrying, wait_until

FAST = BackoffPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)


class Flaky(Exception):
    def __init__(self, retry_after_s: float | None = None) -> None:
        super().__init__("flaky")
        self.retry_after_s = retry_after_s


def test_attempts_stop_at_the_policy_and_the_last_error_propagates():
    calls = []

    def fail() -> None:
        calls.append(1)
        raise Flaky

    with pytest.raises(Flaky):
        retrying(FAST, retry_on=Flaky)(fail)
    assert len(calls) == 3


def test_errors_not_named_are_not_retried():
    calls = []

    def fail() -> None:
        calls.append(1)
        raise KeyError("final")

    with pytest.raises(KeyError):
        retrying(FAST, retry_on=Flaky)(fail)
    assert len(calls) == 1


def test_retry_after_on_the_error_replaces_the_backoff():
    slept: list[float] = []
    loop = retrying(FAST, retry_on=Flaky)
    loop.sleep = slept.append  # type: ignore[method-assign]
    with pytest.raises(Flaky):
        loop(lambda: (_ for _ in ()).throw(Flaky(retry_after_s=7.0)))
    assert slept == [7.0, 7.0]


def test_backoff_grows_to_its_ceiling():
    policy = BackoffPolicy(max_attempts=9, initial_backoff_s=1.0, max_backoff_s=5.0, jitter=0.0)
    assert [backoff_delay(n, policy) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_cancel_event_cuts_the_wait_short():
    cancel = threading.Event()
    slow = BackoffPolicy(max_attempts=5, initial_backoff_s=30.0, max_backoff_s=30.0, jitter=0.0)
    threading.Timer(0.05, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(InterruptedError):
        retrying(slow, retry_on=Flaky, cancel=cancel)(lambda: (_ for _ in ()).throw(Flaky()))
    assert time.monotonic() - started < 5


def test_wait_until_returns_false_at_the_deadline_and_true_once_ready():
    assert not wait_until(lambda: False, timeout_s=0.05, interval_s=0.01)
    ticks = iter([False, False, True])
    assert wait_until(lambda: next(ticks), timeout_s=5, interval_s=0.001)
