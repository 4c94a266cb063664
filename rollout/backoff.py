"""Exponential backoff with jitter, and a sleep that a cancel event cuts short."""

from __future__ import annotations

import random
import threading
import time

from trajlake.rollout.config import RetryConfig
from trajlake.rollout.errors import Cancelled


def backoff_delay(retry: int, config: RetryConfig, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number `retry` (1 = the first retry)."""
    ceiling = min(config.max_backoff_s, config.initial_backoff_s * config.multiplier ** (retry - 1))
    jittered = (rng or random).uniform(0, ceiling * config.jitter)
    return ceiling * (1 - config.jitter) + jittered


def retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (the HTTP-date form is ignored)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def sleep(seconds: float, cancel: threading.Event | None = None) -> None:
    """Sleep, or raise `Cancelled` as soon as `cancel` is set."""
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise Cancelled("cancelled while waiting to retry")
