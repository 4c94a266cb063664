"""TitoClient against a local server answering in vLLM 0.11's completions format (see conftest)."""

from __future__ import annotations

import threading

import pytest

from tests.helpers import wait_until
from trajlake.rollout.config import RetryConfig, TitoConfig
from trajlake.rollout.errors import Cancelled, InferenceError, InferenceResponseError
from trajlake.rollout.tito import ContextLengthExceeded, TitoClient, parse_choice

FAST_RETRY = RetryConfig(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)


def client_for(server, **overrides) -> TitoClient:
    return TitoClient(
        TitoConfig(**{"base_url": server.url, "model": "tiny", "retry": FAST_RETRY, **overrides})
    )


def test_the_prompt_goes_out_as_ids_and_ids_come_back(fake_vllm):
    assert fake_vllm.vllm_version.startswith("0.11")  # the response format these tests follow
    prompt = [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30]
    done = client_for(fake_vllm).complete(prompt, max_tokens=12, temperature=1.0)
    sent = fake_vllm.requests[0]
    assert sent["prompt"] == prompt
    assert sent["return_token_ids"] is True and sent["return_tokens_as_token_ids"] is True
    assert sent["logprobs"] >= 0
    assert done.output_token_ids == fake_vllm.sampled(prompt, 12)
    assert len(done.output_logprobs) == 12 and all(lp <= 0 for lp in done.output_logprobs)
    assert done.prompt_token_ids == prompt
    assert done.finish_reason == "length"


def test_older_vllm_without_token_ids_field_is_read_from_token_id_strings(fake_vllm):
    fake_vllm.legacy = True
    done = client_for(fake_vllm).complete([1, 2, 3], max_tokens=5)
    assert done.output_token_ids == fake_vllm.sampled([1, 2, 3], 5)


@pytest.mark.parametrize("status", [429, 500, 503], ids=["rate-limited", "server-error", "unavailable"])
def test_retryable_statuses_are_retried_until_the_server_answers(fake_vllm, status):
    fake_vllm.failures = [(status, {"retry-after": "0"}), (status, {})]
    done = client_for(fake_vllm).complete([5, 6], max_tokens=3)
    assert done.attempts == 3
    assert len(fake_vllm.requests) == 3
    assert done.output_token_ids == fake_vllm.sampled([5, 6], 3)


def test_retries_give_up_after_max_attempts_with_the_reason(fake_vllm):
    fake_vllm.failures = [(503, {})] * 10
    with pytest.raises(InferenceError, match=r"HTTP 503.*gave up after 4 attempts"):
        client_for(fake_vllm).complete([5], max_tokens=3)
    assert len(fake_vllm.requests) == 4


def test_a_bad_request_is_not_retried(fake_vllm):
    fake_vllm.failures = [(422, {})]
    with pytest.raises(InferenceError, match="HTTP 422") as info:
        client_for(fake_vllm).complete([5], max_tokens=3)
    assert not info.value.retryable
    assert len(fake_vllm.requests) == 1


def test_context_overflow_is_reported_as_its_own_error(fake_vllm):
    fake_vllm.max_model_len = 10
    with pytest.raises(ContextLengthExceeded, match="maximum context length"):
        client_for(fake_vllm).complete(list(range(8)), max_tokens=5)


def test_connection_refused_is_retried_then_reported():
    client = TitoClient(TitoConfig(base_url="http://127.0.0.1:9", retry=FAST_RETRY, connect_timeout_s=0.5))
    with pytest.raises(InferenceError, match="gave up after 4 attempts") as info:
        client.complete([1], max_tokens=1)
    assert info.value.retryable


def test_a_slow_server_times_out(fake_vllm):
    fake_vllm.delay_s = 1.0
    client = client_for(fake_vllm, timeout_s=0.1, retry=RetryConfig(max_attempts=1))
    with pytest.raises(InferenceError, match="ReadTimeout"):
        client.complete([1], max_tokens=1)


def cancel_once_requested(fake_vllm) -> threading.Event:
    """An event set once the server holds the request: the client is then in flight or backing off."""
    cancel = threading.Event()

    def watch() -> None:
        wait_until(lambda: fake_vllm.received > 0, 60, "the request to reach the server")
        cancel.set()

    threading.Thread(target=watch, daemon=True).start()
    return cancel


def test_cancel_stops_a_request_in_flight(fake_vllm):
    fake_vllm.delay_s = 2.0
    cancel = cancel_once_requested(fake_vllm)
    with pytest.raises(Cancelled, match="in flight"):
        client_for(fake_vllm).complete([1, 2], max_tokens=4, cancel=cancel)


def test_cancel_stops_the_backoff_between_retries(fake_vllm):
    fake_vllm.failures = [(503, {"retry-after": "30"})]
    cancel = cancel_once_requested(fake_vllm)
    with pytest.raises(Cancelled, match="retry"):
        client_for(fake_vllm).complete([1, 2], max_tokens=4, cancel=cancel)


@pytest.mark.parametrize(
    ("choice", "match"),
    [
        ({"logprobs": {"tokens": ["hello"], "token_logprobs": [-0.1]}}, "return_tokens_as_token_ids"),
        ({"logprobs": None}, "no token ids"),
        ({"token_ids": [1, 2], "logprobs": {"token_logprobs": [-0.1]}}, "one logprob per output token"),
        ({"token_ids": [1], "logprobs": {"tokens": ["token_id:2"], "token_logprobs": [-0.1]}}, "disagree"),
        (
            {"token_ids": [1], "prompt_token_ids": [9, 9], "logprobs": {"token_logprobs": [-0.1]}},
            "re-tokenised",
        ),
    ],
    ids=["text-tokens", "no-ids", "short-logprobs", "ids-disagree", "prompt-changed"],
)
def test_responses_that_would_break_tito_are_refused(choice, match):
    with pytest.raises(InferenceResponseError, match=match):
        parse_choice(choice, sent_prompt=[1, 2])


def test_a_trajectory_driven_through_the_client_stores_exactly_the_returned_ids(fake_vllm, lake, bus, drain):
    from trajlake.ingest.recorder import Recorder

    client = client_for(fake_vllm)
    recorder = Recorder(bus, run_id="tito-run", vocab_size=50_000)
    prompt = [100, 200, 300, 400]
    outputs, logprobs = [], []
    with recorder.start("task-1", environment="math", context_budget_tokens=4096) as traj:
        history = list(prompt)
        for _ in range(3):
            done = client.complete(history, max_tokens=6)
            assert not done.record(traj, policy_version=7)
            outputs.append(done.output_token_ids)
            logprobs.append(done.output_logprobs)
            tool_ids = [11, 12, 13]  # what the environment appends, already ids
            history = history + done.output_token_ids + tool_ids
        traj.reward(1.0, verifier="exact")
        traj.finish("completed")
    drain()

    turns = lake.sql(
        "select turn_index, output_token_ids, output_logprobs, tito_drift from turns "
        "where run_id = 'tito-run' order by turn_index"
    ).to_pylist()
    assert [t["output_token_ids"] for t in turns] == outputs
    for t, lps in zip(turns, logprobs, strict=True):
        assert t["output_logprobs"] == pytest.approx(lps, abs=1e-6)  # float32 storage
    assert not any(t["tito_drift"] for t in turns)
    row = lake.sql(
        "select token_ids, tito_drift, n_turns from trajectories where run_id = 'tito-run'"
    ).to_pylist()[0]
    expected = prompt + outputs[0] + [11, 12, 13] + outputs[1] + [11, 12, 13] + outputs[2]
    assert row["token_ids"] == expected
    assert row["n_turns"] == 3 and row["tito_drift"] is False
