"""Local HTTP servers for the rollout tests: a vLLM-format completions server and a judge API.

The completions server answers like vLLM 0.11 (OpenAI-compatible `/v1/completions` with
`return_token_ids` and `return_tokens_as_token_ids`): each choice carries `token_ids`,
`prompt_token_ids`, and `logprobs.tokens` as "token_id:<id>" strings.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

VLLM_VERSION_FOLLOWED = "0.11.0"


def token_logprob(token: int) -> float:
    """The fake model's logprob of a token: a function of the token alone, so re-scoring agrees."""
    return -0.001 - 0.01 * (token % 50)


def sampled_ids(prompt: list[int], n: int, vocab: int = 50_000) -> list[int]:
    """The fake model's deterministic output for a prompt (ids any tokenizer would mangle)."""
    seed = sum(prompt) * 31 + len(prompt)
    return [(seed + 7919 * (i + 1)) % vocab for i in range(n)]


@dataclass
class FakeVllm:
    """State and knobs of the fake vLLM server."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    failures: list[tuple[int, dict[str, str]]] = field(
        default_factory=list
    )  # (status, headers) to answer first
    delay_s: float = 0.0
    received: int = 0  # requests read so far, counted before `delay_s`: the client is then in flight
    max_model_len: int = 4096
    legacy: bool = False  # answer like vLLM 0.6-0.10.1: no token_ids/prompt_token_ids fields
    eos_after: int | None = None
    vllm_version: str = VLLM_VERSION_FOLLOWED

    @staticmethod
    def sampled(prompt: list[int], n: int) -> list[int]:
        """What the server samples for `prompt`."""
        return sampled_ids(prompt, n)

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        self.requests.append(body)
        if self.failures:
            status, headers = self.failures.pop(0)
            return status, headers, {"object": "error", "message": "temporarily unavailable", "code": status}
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompt = [ord(c) for c in prompt]
        max_tokens = body.get("max_tokens", 16)
        if len(prompt) + max_tokens > self.max_model_len:
            message = (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
            return (
                400,
                {},
                {
                    "object": "error",
                    "message": message,
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
            )
        n = max_tokens if self.eos_after is None else min(max_tokens, self.eos_after)
        ids = sampled_ids(prompt, n)
        logprobs = [token_logprob(t) for t in ids]
        tokens = [f"token_id:{t}" for t in ids]
        choice: dict[str, Any] = {
            "index": 0,
            "text": "".join(f"<{t}>" for t in ids),
            "logprobs": {
                "text_offset": [i * 7 for i in range(n)],
                "token_logprobs": logprobs,
                "tokens": tokens,
                "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, logprobs, strict=True)],
            },
            "finish_reason": "length" if n == max_tokens else "stop",
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": token_logprob(t), "rank": 1, "decoded_token": f"<{t}>"}}
                for t in prompt[1:]
            ]
        if not self.legacy and body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt
            choice["token_ids"] = ids
        answer = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n},
            "kv_transfer_params": None,
        }
        return 200, {}, answer


def _serve(handler_factory: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_factory)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _JsonHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, headers: dict[str, str], payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client cancelled
            self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        return json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    """A vLLM-format `/v1/completions` server on 127.0.0.1 in a thread."""
    state = FakeVllm()

    class Handler(_JsonHandler):
        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._reply(
                    200,
                    {},
                    {
                        "object": "list",
                        "data": [{"id": "tiny", "object": "model", "max_model_len": state.max_model_len}],
                    },
                )
            elif self.path == "/version":
                self._reply(200, {}, {"version": state.vllm_version})
            else:
                self._reply(404, {}, {"detail": "Not Found"})

        def do_POST(self) -> None:
            if self.path == "/tokenize":  # vLLM's /tokenize: text -> ids (the fake uses code points)
                body = self._body()
                ids = ([1] if body.get("add_special_tokens", True) else []) + [ord(c) for c in body["prompt"]]
                self._reply(200, {}, {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids})
                return
            if self.path != "/v1/completions":
                self._reply(404, {}, {"detail": "Not Found"})
                return
            body = self._body()
            state.received += 1
            if state.delay_s:
                time.sleep(state.delay_s)
            self._reply(*state.respond(body))

    server, state.url = _serve(Handler)
    yield state
    server.shutdown()
    server.server_close()


@dataclass
class FakeJudge:
    """An OpenAI-compatible chat server where some keys are rate-limited."""

    url: str = ""
    limited_keys: set[str] = field(default_factory=set)
    limited_times: dict[str, int] = field(default_factory=dict)  # key -> 429s left before it recovers
    calls: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def fake_judge() -> Iterator[FakeJudge]:
    """A judge server on 127.0.0.1 that answers 429 for rate-limited API keys."""
    state = FakeJudge()

    class Handler(_JsonHandler):
        def do_POST(self) -> None:
            key = self.headers.get("authorization", "").removeprefix("Bearer ")
            body = self._body()
            with state.lock:
                state.calls.append(key)
                left = state.limited_times.get(key, 0)
                limited = key in state.limited_keys or left > 0
                if left > 0:
                    state.limited_times[key] = left - 1
            if limited:
                self._reply(
                    429,
                    {"retry-after": "0"},
                    {"error": {"message": "Rate limit reached", "type": "rate_limit"}},
                )
                return
            question = body["messages"][-1]["content"]
            verdict = "PASS" if "correct" in question else "FAIL"
            self._reply(
                200,
                {},
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": verdict},
                            "finish_reason": "stop",
                        }
                    ],
                },
            )

    server, state.url = _serve(Handler)
    yield state
    server.shutdown()
    server.server_close()
