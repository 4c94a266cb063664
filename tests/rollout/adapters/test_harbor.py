"""Harbor 0.25 adapter: real Harbor jobs (its own venv, trajlake's host environment, no Docker)
recorded live by `HarborHook` — a flaky agent that Harbor retries, and terminus-2 on the session's vLLM."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from tests.fixtures.examples import printed, run_example, stored
from tests.helpers import stored_trajectories, trajlake
from trajlake.rollout import taxonomy
from trajlake.rollout.adapters.harbor import (
    UnsupportedHarbor,
    check_version,
    installed_version,
    trajectory_id_of,
    will_retry,
)


def same_floats(a, b) -> bool:
    return np.array_equal(np.array(a, dtype=np.float32), np.array(b, dtype=np.float32))


@pytest.mark.integration  # a Harbor job in the Harbor venv
def test_a_trial_harbor_retries_ends_once_and_its_abandoned_attempt_is_a_system_failure(run_harbor, tmp_path):
    lake = tmp_path / "lake"
    result = run_harbor("retry", "--lake", str(lake), "--run-id", "hb-retry", "--out", str(tmp_path / "out"))
    first, last = result["ended"]  # Harbor ended two attempts of one trial
    assert first["trial_name"] == last["trial_name"] and first["id"] != last["id"]
    assert first["exception_info"]["exception_type"] == "RuntimeError" and last["exception_info"] is None
    rows = stored_trajectories(lake, "hb-retry")
    assert len(rows) == 2 and all(r["finished_events"] == 1 for r in rows.values())
    trial = rows.pop(
        trajectory_id_of("hb-retry", last["trial_name"])
    )  # the id `trajlake import harbor` gives it
    (abandoned,) = rows.values()
    assert (trial["status"], trial["reward"], trial["tags"]) == ("completed", 1.0, None)
    assert (abandoned["status"], abandoned["failure_origin"], abandoned["failure_label"]) == (
        "error",
        "system",
        "harness_behavior",
    )
    assert abandoned["tags"] == ["retried"] and abandoned["reward"] is None
    assert "abandoned by a Harbor retry" in abandoned["message"] and "RuntimeError" in abandoned["message"]
    assert abandoned["attributes"]["trial_id"] == first["id"]
    # the agent recorded no token ids: the trial is kept and flagged, nothing re-tokenised
    assert trial["n_turns"] == 0 and trial["attributes"]["tokens_recorded"] is False
    assert any("no token ids" in w for w in result["hook"]["warnings"]) and result["dead_letters"] == 0
    # importing the finished job afterwards stores nothing new
    again = trajlake(
        "import", "harbor", result["job_dir"], "--lake", str(lake), "--run", "hb-retry", "--json"
    )
    report = json.loads(again.stdout)
    assert (report["trajectories"], report["skipped_existing"]) == (0, 1)


@pytest.mark.integration  # vLLM, a Harbor job with terminus-2 in the Harbor venv
def test_a_real_terminus_2_trial_is_recorded_live_with_the_engine_s_token_ids(
    run_harbor, vllm_server, tmp_path
):
    lake = tmp_path / "lake"
    result = run_harbor("trial", "--lake", str(lake), "--run-id", "hb-real", "--out", str(tmp_path / "out"),
                        "--url", vllm_server.url, "--model", vllm_server.name)  # fmt: skip
    (ended,) = result["ended"]
    rows = stored_trajectories(lake, "hb-real")
    row = rows[trajectory_id_of("hb-real", ended["trial_name"])]
    assert len(rows) == 1 and row["finished_events"] == 1 and result["dead_letters"] == 0
    (detail,) = ended["agent_result"]["rollout_details"]  # what the engine returned, as Harbor kept it
    completions, prompts, logprobs = (
        detail["completion_token_ids"],
        detail["prompt_token_ids"],
        detail["logprobs"],
    )
    assert completions, "terminus-2 made no model call"
    assert [t["output_token_ids"] for t in row["turns"]] == completions
    for turn, sampled in zip(row["turns"], logprobs, strict=True):
        assert same_floats(turn["output_logprobs"], sampled)
    # each turn's input: the whole first prompt, then what the prompt appended (or, on drift, all of it)
    assert row["turns"][0]["input_token_ids"] == prompts[0]
    for i, turn in enumerate(row["turns"][1:], 1):
        before = prompts[i - 1] + completions[i - 1]
        expected = prompts[i] if turn["tito_drift"] else prompts[i][len(before) :]
        assert turn["input_token_ids"] == expected
    # Harbor's ATIF trajectory carries the same ids per agent step
    atif = [s["metrics"] for s in ended["atif_steps"] if s["source"] == "agent" and s.get("metrics")]
    assert [m["completion_token_ids"] for m in atif] == completions
    # the outcome follows the failure taxonomy (a tiny model rarely answers in terminus-2's JSON)
    exception = ended["exception_info"]
    rewards = (ended["verifier_result"] or {}).get("rewards")
    if exception is not None:
        failure = taxonomy.classify_exception_name(
            exception["exception_type"], exception["exception_message"]
        )
        assert exception["exception_type"] in row["message"]
    else:
        failure = taxonomy.COMPLETED if rewards else taxonomy.VERIFIER_FAILED
    assert (row["status"], row["failure_origin"], row["failure_label"]) == (
        failure.status,
        failure.origin,
        failure.label,
    )
    assert row["reward"] == (rewards["reward"] if rewards and failure.reward_valid else None)
    assert result["hook"]["turns"] == len(completions) and result["hook"]["tokens"] == sum(
        map(len, completions)
    )


@pytest.mark.integration  # the example as its docs say (a plain `python`): the Harbor venv, a real trial on vLLM
def test_the_example_writes_its_trial_into_the_lake(harbor_venv, vllm_server, tmp_path):
    done = run_example("harbor", "--lake", str(tmp_path / "lake"), "--vllm-url", vllm_server.url, "--max-turns", "1",
                       cwd=tmp_path)  # fmt: skip
    said = printed(done.stdout)
    assert said == stored(tmp_path / "lake", "harbor-example") and said["trajectories"] == 1
    assert done.returncode == (0 if said["usable"] else 1), done.stderr[-3000:]


def test_the_version_check_names_the_supported_versions():
    check_version("0.25.0")
    check_version("0.25.3")
    for version in ("0.24.1", "1.0.0", None):
        with pytest.raises(UnsupportedHarbor, match=r"supports harbor 0\.25\.x"):
            check_version(version)


def test_without_harbor_installed_the_hook_says_what_to_install():
    try:
        import harbor  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedHarbor, match="harbor is not installed here"):
            installed_version()
    else:  # pragma: no cover - the project venv does not hold it
        pytest.skip("harbor is installed in this venv")


def retry_config(max_retries=1, include=None, exclude=("AgentTimeoutError",)):
    """The fields of Harbor's RetryConfig the hook reads."""
    return SimpleNamespace(
        max_retries=max_retries, include_exceptions=include, exclude_exceptions=set(exclude)
    )


@pytest.mark.parametrize(
    ("retry", "exception", "attempt", "expected"),
    [
        (retry_config(), "RuntimeError", 0, True),
        (retry_config(), "RuntimeError", 1, False),  # the last attempt Harbor allows
        (retry_config(), None, 0, False),  # no exception: Harbor returns the result
        (retry_config(), "AgentTimeoutError", 0, False),  # excluded
        (retry_config(include={"RateLimitError"}), "RuntimeError", 0, False),  # not included
        (retry_config(include={"RateLimitError"}), "RateLimitError", 0, True),
        (retry_config(max_retries=0), "RuntimeError", 0, False),
        (None, "RuntimeError", 0, False),  # no retry settings known
    ],
    ids=["retried", "last-attempt", "no-exception", "excluded", "not-included", "included", "no-retries", "unknown"],
)  # fmt: skip
def test_an_attempt_counts_as_retried_exactly_when_harbor_retries_it(retry, exception, attempt, expected):
    assert will_retry(retry, exception, attempt) is expected
