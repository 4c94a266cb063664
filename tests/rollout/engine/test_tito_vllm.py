"""The TITO client against the real vLLM server (CPU build) serving the session's tiny model."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import torch

from trajlake.rollout.config import RetryConfig
from trajlake.rollout.engine.chat import ChatSession
from trajlake.rollout.errors import Cancelled, InferenceError
from trajlake.rollout.tito import AsyncTitoClient, ContextLengthExceeded, TitoClient
from trajlake.trainer.hf_policy import HFPolicy

pytestmark = pytest.mark.integration
ROUTES = pytest.mark.parametrize("route", ["completions", "generate"])


def prompt_of(tokenizer, text: str = "calc 3 + 4") -> list[int]:
    return ChatSession(tokenizer, [{"role": "user", "content": text}]).prompt_ids


@ROUTES
def test_ids_go_out_and_the_servers_ids_and_logprobs_come_back(vllm_server, tiny_tokenizer, route):
    prompt = prompt_of(tiny_tokenizer)
    with TitoClient(vllm_server.tito_config(route)) as client:
        done = client.complete(prompt, max_tokens=12, seed=11, prompt_logprobs=True)
        again = client.complete(prompt, max_tokens=12, seed=11)
    assert done.prompt_token_ids == prompt
    assert len(done.output_token_ids) == len(done.output_logprobs) == 12
    assert all(0 <= t < len(tiny_tokenizer) for t in done.output_token_ids)
    assert again.output_token_ids == done.output_token_ids  # the same seed samples the same ids
    assert done.prompt_logprobs is not None and done.prompt_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in done.prompt_logprobs[1:])
    # the engine's logprobs are the model's: a transformers forward pass agrees in float32
    policy = HFPolicy(vllm_server.model_dir)
    full = torch.tensor([prompt + done.output_token_ids])
    ours = policy.token_logprobs(full)[0]
    assert ours[len(prompt) :].tolist() == pytest.approx(done.output_logprobs, abs=1e-4)
    assert ours[1 : len(prompt)].tolist() == pytest.approx(done.prompt_logprobs[1:], abs=1e-4)


def test_the_generate_route_reports_the_weight_version_of_the_output(vllm_server, tiny_tokenizer):
    with TitoClient(vllm_server.tito_config("generate")) as client:
        done = client.complete(prompt_of(tiny_tokenizer), max_tokens=4)
    assert done.weight_versions == [("0", 0, 4)] and done.policy_version == 0


@ROUTES
def test_n_samples_share_the_prompt_and_differ(vllm_server, tiny_tokenizer, route):
    prompt = prompt_of(tiny_tokenizer)
    with TitoClient(vllm_server.tito_config(route)) as client:
        samples = client.sample(prompt, max_tokens=16, n=3, seed=5)
    assert len(samples) == 3 and all(s.prompt_token_ids == prompt for s in samples)
    assert len({tuple(s.output_token_ids) for s in samples}) == 3


@ROUTES
def test_a_prompt_longer_than_the_context_is_its_own_error(vllm_server, route):
    with TitoClient(vllm_server.tito_config(route)) as client, pytest.raises(ContextLengthExceeded):
        client.complete([5] * 5000, max_tokens=4)


def test_a_token_beyond_the_vocabulary_is_a_terminal_error(vllm_server, tiny_tokenizer):
    with (
        TitoClient(vllm_server.tito_config()) as client,
        pytest.raises(InferenceError, match="HTTP 400") as info,
    ):
        client.complete([len(tiny_tokenizer) + 10], max_tokens=2)
    assert not info.value.retryable


def running_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


def test_cancelling_a_request_frees_the_servers_slot(vllm_server, tiny_tokenizer):
    cancel = threading.Event()
    with TitoClient(vllm_server.tito_config()) as client:
        threading.Timer(1.0, cancel.set).start()
        with pytest.raises(Cancelled):
            client.complete(prompt_of(tiny_tokenizer), max_tokens=3000, ignore_eos=True, cancel=cancel)
    deadline = time.monotonic() + 10
    while running_requests(vllm_server.url) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running_requests(vllm_server.url) == 0, "the server still generates for a cancelled request"


def test_async_client_pools_connections_and_runs_requests_concurrently(vllm_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer)

    async def run() -> list:
        async with AsyncTitoClient(vllm_server.tito_config("generate")) as client:
            return await asyncio.gather(
                *[client.complete([*prompt, i], max_tokens=8, seed=i) for i in range(16)]
            )

    done = asyncio.run(run())
    assert [d.prompt_token_ids[-1] for d in done] == list(range(16))
    assert all(len(d.output_token_ids) == 8 for d in done)


def test_a_server_killed_and_restarted_mid_run_is_waited_for(vllm_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer)
    patient = RetryConfig(max_attempts=40, initial_backoff_s=0.5, max_backoff_s=3.0, jitter=0.2)
    with TitoClient(vllm_server.tito_config("generate", retry=patient)) as client:
        before = client.complete(prompt, max_tokens=6, seed=3)
        vllm_server.kill()
        restarter = threading.Thread(target=vllm_server.start)
        restarter.start()
        after = client.complete(prompt, max_tokens=6, seed=3)  # retries while the server comes back
        restarter.join()
    assert after.attempts > 1
    assert after.output_token_ids == before.output_token_ids  # same weights, same seed: same ids
