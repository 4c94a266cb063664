"""LLM-judge calls over an OpenAI-compatible chat API, rotating across API keys.

Each request goes to the next key that is not cooling down. A 429 puts its key on cooldown
(the server's `Retry-After`, else exponential backoff with jitter) and the call moves on to
the next key; only when every key is cooling does the judge wait. A judge that cannot answer
raises `JudgeError`, which the taxonomy files as a system `verifier_error` (no valid reward).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from trajlake.common.retry import backoff_delay, retry_after_s, retrying
from trajlake.rollout.config import JudgeConfig
from trajlake.rollout.errors import JudgeError

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass
class Verdict:
    """The judge's answer and how it was obtained."""

    text: str
    passed: bool
    key_index: int
    attempts: int
    rate_limited: int


class _Busy(Exception):
    """A retryable judge failure: the key is cooling down, try again."""

    def __init__(self, message: str, *, rate_limited: bool = False) -> None:
        super().__init__(message)
        self.rate_limited = rate_limited


class Judge:
    """Asks a judge model to grade an answer; thread-safe, so agent loops can share one."""

    def __init__(
        self, config: JudgeConfig | None = None, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.config = config or JudgeConfig()
        self._client = httpx.Client(
            base_url=self.config.base_url, timeout=self.config.timeout_s, transport=transport
        )
        self._lock = threading.Lock()
        self._next_key = itertools.cycle(range(len(self.config.api_keys)))
        self._cool_until = [0.0] * len(self.config.api_keys)
        self._strikes = [0] * len(self.config.api_keys)

    def _pick_key(self) -> tuple[int, float]:
        """The next key not cooling down, or (key, seconds to wait) for the one that cools first."""
        with self._lock:
            now = time.monotonic()
            for _ in range(len(self._cool_until)):
                k = next(self._next_key)
                if self._cool_until[k] <= now:
                    return k, 0.0
            k = min(range(len(self._cool_until)), key=self._cool_until.__getitem__)
            return k, self._cool_until[k] - now

    def _cool(self, key: int, retry_after: float | None) -> None:
        with self._lock:
            self._strikes[key] += 1
            delay = (
                retry_after
                if retry_after is not None
                else backoff_delay(self._strikes[key], self.config.retry)
            )
            self._cool_until[key] = time.monotonic() + delay

    def ask(self, messages: Sequence[dict[str, str]], *, max_tokens: int = 16) -> tuple[str, int, int, int]:
        """Send a chat request; return (text, key index, attempts, rate-limited responses)."""
        body = {
            "model": self.config.model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        limited = 0
        # No wait between attempts here: each key cools down on its own schedule (`_cool`),
        # and an attempt waits only when every key is cooling (`_pick_key`).
        try:
            for attempt in retrying(self.config.retry, retry_on=_Busy, wait=0):
                with attempt:
                    try:
                        text, key = self._attempt(body, attempt.retry_state.attempt_number)
                    except _Busy as busy:
                        limited += busy.rate_limited
                        raise
                    return text, key, attempt.retry_state.attempt_number, limited
        except _Busy as busy:
            raise JudgeError(
                f"no answer from the judge after {self.config.retry.max_attempts} attempts over "
                f"{len(self.config.api_keys)} key(s) (last: {busy}); add keys or raise TRAJLAKE_JUDGE retry limits",
                attempts=self.config.retry.max_attempts,
            ) from None
        raise AssertionError("unreachable")

    def _attempt(self, body: dict, attempt: int) -> tuple[str, int]:
        """One request on the next free key; `_Busy` when another key (or a later try) may answer."""
        key, wait = self._pick_key()
        if wait > 0:
            time.sleep(min(wait, self.config.retry.max_backoff_s))
        headers = {"Authorization": f"Bearer {self.config.api_keys[key]}"}
        try:
            response = self._client.post("/v1/chat/completions", json=body, headers=headers)
        except httpx.TransportError as err:  # the judge server may come back; try the next key
            self._cool(key, None)
            raise _Busy(f"{type(err).__name__}: {err}") from err
        if response.status_code == 200:
            with self._lock:
                self._strikes[key] = 0
            return response.json()["choices"][0]["message"]["content"], key
        last = f"HTTP {response.status_code}: {response.text[:200]}"
        if response.status_code not in RETRYABLE_STATUS:
            raise JudgeError(
                f"judge request refused ({last}); check the judge model and keys", attempts=attempt
            )
        self._cool(key, retry_after_s(response.headers.get("retry-after")))
        raise _Busy(last, rate_limited=response.status_code == 429)

    def grade(self, question: str, answer: str, *, rubric: str = "Reply PASS or FAIL.") -> Verdict:
        """Grade `answer` to `question`; passed when the judge's reply starts with PASS."""
        prompt = f"{rubric}\n\nQuestion:\n{question}\n\nAnswer:\n{answer}"
        text, key, attempts, limited = self.ask([{"role": "user", "content": prompt}])
        return Verdict(text, text.strip().upper().startswith("PASS"), key, attempts, limited)

    def close(self) -> None:
        self._client.close()
