"""Token-in-token-out client of vLLM's OpenAI-compatible `/v1/completions`.

The prompt goes out as a list of token ids and the sampled ids come back as ids, so nothing
is ever decoded and re-encoded. The client follows vLLM >= 0.10.2 (checked against the
0.10.2-0.11 protocol): the request sets `return_token_ids` (the choice then carries
`token_ids` and `prompt_token_ids`) and `return_tokens_as_token_ids` (each entry of
`logprobs.tokens` reads `"token_id:<id>"`). Older servers (0.6-0.10.1) only honour the
second, and the client reads the ids from there; when both are present they must agree.

    client = TitoClient(TitoConfig(base_url="http://127.0.0.1:8000", model="Qwen/Qwen3-0.6B"))
    done = client.complete(prompt_ids, max_tokens=256)
    traj.turn(full_input_token_ids=done.prompt_token_ids, output_token_ids=done.output_token_ids,
              output_logprobs=done.output_logprobs, policy_version=v, finish_reason=done.finish_reason)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import httpx

from trajlake.rollout import backoff
from trajlake.rollout.config import TitoConfig
from trajlake.rollout.errors import Cancelled, InferenceError, InferenceResponseError

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
TOKEN_ID_PREFIX = "token_id:"


class ContextLengthExceeded(InferenceError):
    """The prompt plus `max_tokens` does not fit the model's context (a model-side outcome)."""


@dataclass
class Completion:
    """One sampled continuation, exactly as the server returned it."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str | None
    stop_reason: int | str | None = None
    latency_s: float = 0.0
    attempts: int = 1
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def record(self, traj: Any, policy_version: int, **turn_fields: Any) -> bool:
        """Record this completion as a turn of `traj` (a `TrajectoryRecorder`); return drift."""
        return traj.turn(
            full_input_token_ids=self.prompt_token_ids,
            output_token_ids=self.output_token_ids,
            output_logprobs=self.output_logprobs,
            policy_version=policy_version,
            finish_reason=self.finish_reason,
            latency_s=self.latency_s,
            **turn_fields,
        )


def parse_choice(choice: Mapping[str, Any], sent_prompt: Sequence[int]) -> tuple[list[int], list[float]]:
    """Token ids and logprobs of a vLLM completion choice; raise if they are missing or disagree."""
    logprobs = choice.get("logprobs") or {}
    ids_from_tokens = None
    if logprobs.get("tokens") is not None:
        ids_from_tokens = [_token_id(t) for t in logprobs["tokens"]]
    ids = choice.get("token_ids")
    if ids is None:
        ids = ids_from_tokens
    elif ids_from_tokens is not None and list(ids) != ids_from_tokens:
        raise InferenceResponseError(
            "choice.token_ids and logprobs.tokens disagree; the server is not vLLM-compatible"
        )
    if ids is None:
        raise InferenceResponseError(
            "the response carries no token ids; serve with vLLM >= 0.10.2 (return_token_ids) "
            "or >= 0.6 (return_tokens_as_token_ids with logprobs)"
        )
    values = logprobs.get("token_logprobs")
    if values is None or len(values) != len(ids):
        raise InferenceResponseError(
            f"expected one logprob per output token ({len(ids)}), got {None if values is None else len(values)}; "
            "the client must send logprobs >= 0"
        )
    if any(v is None or not math.isfinite(v) for v in values):
        raise InferenceResponseError("a sampled token has no finite logprob")
    echoed = choice.get("prompt_token_ids")
    if echoed is not None and list(echoed) != list(sent_prompt):
        raise InferenceResponseError(
            "the server's prompt_token_ids differ from the ids sent: it re-tokenised the prompt"
        )
    return [int(i) for i in ids], [float(v) for v in values]


def _token_id(token: str) -> int:
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        raise InferenceResponseError(
            f"logprobs.tokens entry {token!r} is text, not 'token_id:<id>'; send return_tokens_as_token_ids=true"
        )
    return int(token[len(TOKEN_ID_PREFIX) :])


class TitoClient:
    """Sends token ids to vLLM and returns token ids and logprobs; retries, times out, cancels."""

    def __init__(
        self, config: TitoConfig | None = None, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.config = config or TitoConfig()
        self._transport = transport

    def _client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
        return httpx.Client(
            base_url=self.config.base_url, timeout=timeout, headers=headers, transport=self._transport
        )

    def request_body(
        self, prompt_token_ids: Sequence[int], max_tokens: int, **sampling: Any
    ) -> dict[str, Any]:
        """The JSON body of a completion request for `prompt_token_ids`."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "prompt": [int(t) for t in prompt_token_ids],
            "max_tokens": int(max_tokens),
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stream": False,
        }
        body.update({k: v for k, v in sampling.items() if v is not None})
        return body

    def complete(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cancel: threading.Event | None = None,
        **sampling: Any,
    ) -> Completion:
        """Sample a continuation of `prompt_token_ids`.

        Retries connect errors, 408/429/5xx with exponential backoff and jitter (honouring
        `Retry-After`); raises `Cancelled` as soon as `cancel` is set, `ContextLengthExceeded`
        when the prompt does not fit, `InferenceError` otherwise.
        """
        prompt = [int(t) for t in prompt_token_ids]
        body = self.request_body(prompt, max_tokens, **sampling)
        retry = self.config.retry
        started = time.monotonic()
        for attempt in range(1, retry.max_attempts + 1):
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled before the request was sent")
            try:
                response = self._post(body, cancel)
            except httpx.TransportError as err:  # connect refused/reset, timeouts: the server may come back
                error: InferenceError = InferenceError(f"{type(err).__name__}: {err}", retryable=True)
                wait = None
            else:
                if response.status_code == 200:
                    choice = _first_choice(response)
                    ids, logprobs = parse_choice(choice, prompt)
                    return Completion(
                        prompt_token_ids=prompt,
                        output_token_ids=ids,
                        output_logprobs=logprobs,
                        finish_reason=choice.get("finish_reason"),
                        stop_reason=choice.get("stop_reason"),
                        latency_s=time.monotonic() - started,
                        attempts=attempt,
                        raw=response.json(),
                    )
                error = _http_error(response)
                wait = backoff.retry_after_s(response.headers.get("retry-after"))
            if not error.retryable or attempt == retry.max_attempts:
                if error.retryable:
                    error.args = (f"{error.args[0]} (gave up after {attempt} attempts)",)
                raise error
            backoff.sleep(wait if wait is not None else backoff.backoff_delay(attempt, retry), cancel)
        raise AssertionError("unreachable")

    def _post(self, body: dict[str, Any], cancel: threading.Event | None) -> httpx.Response:
        """POST in a helper thread when cancellable, so that setting `cancel` returns at once."""
        if cancel is None:
            with self._client() as client:
                return client.post("/v1/completions", json=body)
        client = self._client()
        future: Future[httpx.Response] = Future()

        def send() -> None:
            try:
                future.set_result(client.post("/v1/completions", json=body))
            except BaseException as err:  # handed to the caller through the future
                future.set_exception(err)

        threading.Thread(target=send, name="tito-request", daemon=True).start()
        while not future.done():
            if cancel.wait(0.02):
                client.close()  # aborts the connection; the server stops generating for a closed socket
                raise Cancelled("cancelled while the request was in flight")
        client.close()
        return future.result()


def _first_choice(response: httpx.Response) -> dict[str, Any]:
    try:
        return response.json()["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise InferenceResponseError(f"not a completions response: {response.text[:200]!r}") from err


def _http_error(response: httpx.Response) -> InferenceError:
    text = response.text[:500]
    if response.status_code == 400 and "context length" in text.lower():
        return ContextLengthExceeded(f"HTTP 400: {text}", status_code=400)
    retryable = response.status_code in RETRYABLE_STATUS
    return InferenceError(
        f"HTTP {response.status_code}: {text}", status_code=response.status_code, retryable=retryable
    )
