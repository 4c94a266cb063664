"""LLM judge: key rotation and backoff against a local server that rate-limits one key."""

from __future__ import annotations

import pytest

from trajlake.rollout.config import JudgeConfig, RetryConfig
from trajlake.rollout.errors import JudgeError
from trajlake.rollout.judge import Judge
from trajlake.rollout.taxonomy import classify_exception

FAST = RetryConfig(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05)


def judge_for(server, keys) -> Judge:
    return Judge(JudgeConfig(base_url=server.url, api_keys=keys, retry=FAST))


def test_calls_rotate_across_keys(fake_judge):
    judge = judge_for(fake_judge, ("k1", "k2", "k3"))
    for _ in range(6):
        judge.grade("is 2+2=4 correct?", "yes")
    judge.close()
    assert fake_judge.calls == ["k1", "k2", "k3", "k1", "k2", "k3"]


def test_a_rate_limited_key_is_skipped_and_every_call_is_answered(fake_judge):
    fake_judge.limited_keys = {"k2"}
    judge = judge_for(fake_judge, ("k1", "k2", "k3"))
    verdicts = [judge.grade("correct?", "yes") for _ in range(6)]
    judge.close()
    assert all(v.passed for v in verdicts)
    assert {v.key_index for v in verdicts} <= {0, 2}
    assert sum(v.rate_limited for v in verdicts) >= 1
    assert fake_judge.calls.count("k2") < 6


def test_a_single_key_backs_off_until_the_rate_limit_lifts(fake_judge):
    fake_judge.limited_times = {"only": 2}
    judge = judge_for(fake_judge, ("only",))
    verdict = judge.grade("wrong?", "no")
    judge.close()
    assert verdict.attempts == 3 and verdict.rate_limited == 2 and not verdict.passed


def test_a_judge_that_never_answers_is_a_system_verifier_error(fake_judge):
    fake_judge.limited_keys = {"a", "b"}
    judge = judge_for(fake_judge, ("a", "b"))
    with pytest.raises(JudgeError, match="after 6 attempts over 2 key") as info:
        judge.grade("q", "a")
    judge.close()
    failure = classify_exception(info.value)
    assert (failure.origin, failure.label, failure.reward_valid) == ("system", "verifier_error", False)


def test_keys_come_from_a_comma_separated_env_var(monkeypatch):
    monkeypatch.setenv("TRAJLAKE_JUDGE_API_KEYS", "a, b,c")
    assert JudgeConfig.from_env().api_keys == ("a", "b", "c")
