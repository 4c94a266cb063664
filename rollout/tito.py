"""Token-in-token-out client of vLLM: token ids out, token ids and logprobs back, nothing re-tokenised.

Two routes of a vLLM server carry ids both ways:
- `completions` — the OpenAI-compatible `/v1/completions` with `prompt: [ids]`,
  `return_token_ids` (the choice then carries `token_ids` and `prompt_token_ids`) and
  `return_tokens_as_token_ids` (each entry of `logprobs.tokens` reads `"token_id:<id>"`); older
  servers (0.6-0.10.1) only honour the second, and the ids are read from there.
- `generate` — vLLM's token-in/token-out route `/inference/v1/generate` (served with
  `--enable-scale-out`, the route SkyRL and verifiers use), which also says which weight version
  sampled each output span: an RL run records that as the turn's policy version.

`AsyncTitoClient` keeps one pooled keep-alive `httpx.AsyncClient`; cancelling the awaiting task
closes its connection, and vLLM aborts a request whose client went away, freeing the slot.
`TitoClient` is the same client for synchronous code (a private event loop in a thread).

    async with AsyncTitoClient(TitoConfig(base_url="http://127.0.0.1:8000", model="tiny")) as client:
        done = await client.complete(prompt_ids, max_tokens=256, seed=7)
        served = v if done.policy_version is None else done.policy_version  # version 0 is a version
        traj.turn(done.output_token_ids, done.output_logprobs, served,
                  full_input_token_ids=done.prompt_token_ids, finish_reason=done.finish_reason)
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from trajlake.common.retry import retry_after_s, retrying_async
from trajlake.rollout.config import TitoConfig
from trajlake.rollout.errors import Cancelled, InferenceError, InferenceResponseError

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
TOKEN_ID_PREFIX = "token_id:"
ROUTES = {"completions": "/v1/completions", "generate": "/inference/v1/generate"}
CONTEXT_MESSAGES = ("maximum context length", "maximum model length", "max_tokens must be at least 1")
T = TypeVar("T")


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
    weight_versions: list[tuple[str, int, int]] = field(default_factory=list)  # (version, start, end)
    prompt_logprobs: list[float | None] | None = None  # one per prompt token; the first has none
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def policy_version(self) -> int | None:
        """The oldest integer weight version that sampled this output (None if the server gave none)."""
        versions = [int(v) for v, _, _ in self.weight_versions if str(v).lstrip("-").isdigit()]
        return min(versions) if versions else None

    def record(self, traj: Any, policy_version: int | None, **turn_fields: Any) -> bool:
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
    """Token ids and logprobs of a `/v1/completions` choice; raise if they are missing or disagree."""
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
    _check_echo(choice.get("prompt_token_ids"), sent_prompt)
    return [int(i) for i in ids], _finite(logprobs.get("token_logprobs"), len(ids))


def parse_generate_choice(
    choice: Mapping[str, Any], sent_prompt: Sequence[int], echoed: Sequence[int] | None = None
) -> tuple[list[int], list[float]]:
    """Token ids and logprobs of an `/inference/v1/generate` choice; raise if they are missing."""
    ids = choice.get("token_ids")
    if ids is None:
        raise InferenceResponseError(
            "the generate response carries no token_ids; is this vLLM's token route?"
        )
    content = (choice.get("logprobs") or {}).get("content")
    values = None if content is None else [c.get("logprob") for c in content]
    if content is not None and [c.get("token_id") for c in content] != list(ids):
        raise InferenceResponseError("logprobs.content token ids differ from choice.token_ids")
    _check_echo(echoed, sent_prompt)
    return [int(i) for i in ids], _finite(values, len(ids))


def _check_echo(echoed: Sequence[int] | None, sent: Sequence[int]) -> None:
    if echoed is not None and list(echoed) != list(sent):
        raise InferenceResponseError(
            "the server's prompt_token_ids differ from the ids sent: it re-tokenised the prompt"
        )


def _finite(values: Sequence[Any] | None, n: int) -> list[float]:
    if values is None or len(values) != n:
        raise InferenceResponseError(
            f"expected one logprob per output token ({n}), got {None if values is None else len(values)}; "
            "the client must send logprobs >= 0"
        )
    if any(v is None or not math.isfinite(v) for v in values):
        raise InferenceResponseError("a sampled token has no finite logprob")
    return [float(v) for v in values]


def _token_id(token: str) -> int:
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        raise InferenceResponseError(
            f"logprobs.tokens entry {token!r} is text, not 'token_id:<id>'; send return_tokens_as_token_ids=true"
        )
    return int(token[len(TOKEN_ID_PREFIX) :])


def _prompt_logprobs(entries: Sequence[Any] | None, prompt: Sequence[int]) -> list[float | None] | None:
    """vLLM's prompt_logprobs (a dict per position keyed by token id) as one float per prompt token."""
    if entries is None:
        return None
    out: list[float | None] = []
    for token, entry in zip(prompt, entries, strict=False):
        hit = None if entry is None else entry.get(str(token))
        out.append(None if hit is None else float(hit["logprob"]))
    return out


class AsyncTitoClient:
    """Sends token ids to vLLM and returns token ids and logprobs; pools connections, retries, cancels."""

    def __init__(
        self, config: TitoConfig | None = None, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config or TitoConfig()
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.config.base_url,
            timeout=httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s),
            headers=headers,
            transport=transport,
            limits=httpx.Limits(
                max_connections=self.config.max_connections,
                max_keepalive_connections=self.config.max_connections,
            ),
        )

    async def __aenter__(self) -> AsyncTitoClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    def request_body(
        self, prompt_token_ids: Sequence[int], max_tokens: int, **sampling: Any
    ) -> dict[str, Any]:
        """The JSON body of a request for `prompt_token_ids` on the configured route."""
        prompt = [int(t) for t in prompt_token_ids]
        params = {k: v for k, v in sampling.items() if v is not None}
        if self.config.route == "generate":
            params.setdefault("logprobs", 0)
            if params.pop("prompt_logprobs", None) is not None:
                params["prompt_logprobs"] = 0
            return {
                "model": self.config.model, "token_ids": prompt, "return_token_ids": True,
                "sampling_params": {"max_tokens": int(max_tokens), "skip_special_tokens": False, **params},
            }  # fmt: skip
        return {
            "model": self.config.model, "prompt": prompt, "max_tokens": int(max_tokens), "logprobs": 1,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": False,
            "stream": False, **params,
        }  # fmt: skip

    async def complete(
        self, prompt_token_ids: Sequence[int], *, max_tokens: int, **sampling: Any
    ) -> Completion:
        """Sample one continuation of `prompt_token_ids` (see `sample` for errors and retries)."""
        return (await self.sample(prompt_token_ids, max_tokens=max_tokens, **sampling))[0]

    async def sample(
        self, prompt_token_ids: Sequence[int], *, max_tokens: int, **sampling: Any
    ) -> list[Completion]:
        """Sample `n` (a sampling parameter, default 1) continuations of `prompt_token_ids`.

        Retries connect errors, 408/429/5xx with exponential backoff and jitter (honouring
        `Retry-After`), so a server that is restarted mid-run is waited for; raises
        `ContextLengthExceeded` when the prompt does not fit, `InferenceResponseError` when the
        answer lacks token ids, `InferenceError` otherwise. Cancelling the caller's task aborts
        the request on the server.
        """
        prompt = [int(t) for t in prompt_token_ids]
        body = self.request_body(prompt, max_tokens, **sampling)
        started = time.monotonic()
        attempt = 0
        try:
            async for attempt_ in retrying_async(self.config.retry, retry_on=_is_retryable):
                with attempt_:
                    attempt = attempt_.retry_state.attempt_number
                    return await self._attempt(body, prompt, started, attempt)
        except InferenceError as error:
            if error.retryable:
                error.args = (f"{error.args[0]} (gave up after {attempt} attempts)",)
            raise
        raise AssertionError("unreachable")

    async def _attempt(
        self, body: dict[str, Any], prompt: list[int], started: float, attempt: int
    ) -> list[Completion]:
        """One request; a retryable failure carries the server's `Retry-After` for the next wait."""
        try:
            response = await self._http.post(ROUTES[self.config.route], json=body)
        except httpx.TransportError as err:  # refused/reset/timed out: the server may come back
            raise InferenceError(
                f"{type(err).__name__} from {self.config.base_url}: {err}", retryable=True
            ) from err
        if response.status_code != 200:
            error = _http_error(response)
            error.retry_after_s = retry_after_s(response.headers.get("retry-after"))
            raise error
        return self._completions(response, prompt, started, attempt)

    def _completions(
        self, response: httpx.Response, prompt: list[int], started: float, attempt: int
    ) -> list[Completion]:
        try:
            payload = response.json()
            choices = sorted(payload["choices"], key=lambda c: c.get("index", 0))
        except (ValueError, KeyError, TypeError) as err:
            raise InferenceResponseError(f"not a completions response: {response.text[:200]!r}") from err
        if not choices:
            raise InferenceResponseError("the response has no choices")
        latency = time.monotonic() - started
        out = []
        for choice in choices:
            if self.config.route == "generate":
                ids, logprobs = parse_generate_choice(choice, prompt, payload.get("prompt_token_ids"))
                prompt_lps = _generate_prompt_logprobs(payload.get("prompt_logprobs"), prompt)
            else:
                ids, logprobs = parse_choice(choice, prompt)
                prompt_lps = _prompt_logprobs(choice.get("prompt_logprobs"), prompt)
            spans = [
                (str(s["version"]), int(s["start"]), int(s["end"]))
                for s in choice.get("weight_versions") or []
            ]
            out.append(
                Completion(
                    prompt_token_ids=prompt,
                    output_token_ids=ids,
                    output_logprobs=logprobs,
                    finish_reason=choice.get("finish_reason"),
                    stop_reason=choice.get("stop_reason"),
                    latency_s=latency,
                    attempts=attempt,
                    weight_versions=spans,
                    prompt_logprobs=prompt_lps,
                    raw=payload,
                )
            )
        return out


def _is_retryable(error: BaseException) -> bool:
    return isinstance(error, InferenceError) and error.retryable


def _generate_prompt_logprobs(
    entries: Sequence[Any] | None, prompt: Sequence[int]
) -> list[float | None] | None:
    if entries is None:
        return None
    out: list[float | None] = []
    for token, entry in zip(prompt, entries, strict=False):
        if entry is None:
            out.append(None)
        elif isinstance(entry, Mapping):
            hit = entry.get(str(token))
            out.append(None if hit is None else float(hit["logprob"]))
        else:  # a list of {token_id, logprob} candidates
            out.append(next((float(c["logprob"]) for c in entry if c.get("token_id") == token), None))
    return out


def _http_error(response: httpx.Response) -> InferenceError:
    text = response.text[:500]
    if response.status_code == 400 and any(m in text.lower() for m in CONTEXT_MESSAGES):
        return ContextLengthExceeded(f"HTTP 400: {text}", status_code=400)
    retryable = response.status_code in RETRYABLE_STATUS
    return InferenceError(
        f"HTTP {response.status_code}: {text}", status_code=response.status_code, retryable=retryable
    )


class TitoClient:
    """`AsyncTitoClient` for synchronous callers: its own event loop in a daemon thread."""

    def __init__(
        self, config: TitoConfig | None = None, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config or TitoConfig()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tito-loop", daemon=True)
        self._thread.start()
        self._async = self._run(self._make_async(transport))

    async def _make_async(self, transport: httpx.AsyncBaseTransport | None) -> AsyncTitoClient:
        return AsyncTitoClient(self.config, transport=transport)

    def _run(self, coro: Coroutine[Any, Any, T], cancel: threading.Event | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        if cancel is None:
            return future.result()
        while True:
            try:
                return future.result(timeout=0.02)
            except TimeoutError:
                if cancel.is_set():
                    future.cancel()  # closes the connection: vLLM aborts the request
                    raise Cancelled("cancelled while the request was in flight or waiting to retry") from None

    def request_body(
        self, prompt_token_ids: Sequence[int], max_tokens: int, **sampling: Any
    ) -> dict[str, Any]:
        """The JSON body of a request for `prompt_token_ids`."""
        return self._async.request_body(prompt_token_ids, max_tokens, **sampling)

    def complete(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cancel: threading.Event | None = None,
        **sampling: Any,
    ) -> Completion:
        """Sample one continuation; raises `Cancelled` as soon as `cancel` is set (also between retries)."""
        return self.sample(prompt_token_ids, max_tokens=max_tokens, cancel=cancel, **sampling)[0]

    def sample(
        self,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        cancel: threading.Event | None = None,
        **sampling: Any,
    ) -> list[Completion]:
        """`AsyncTitoClient.sample`, blocking; `cancel` aborts it."""
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled before the request was sent")
        return self._run(self._async.sample(prompt_token_ids, max_tokens=max_tokens, **sampling), cancel)

    def close(self) -> None:
        """Close connections and stop the loop thread."""
        if self._loop.is_running():
            self._run(self._async.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def __enter__(self) -> TitoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
