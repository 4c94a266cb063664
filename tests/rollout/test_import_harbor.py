"""Harbor importer on job directories built here in Harbor's formats (TrialResult + ATIF v1.4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajlake.rollout.importers.harbor import import_harbor
from trajlake.store.lake import Lake

P1 = [151644, 8948, 198, 2610, 525]  # the first prompt
C1 = [40, 1184, 1598, 13]
ENV = [151645, 198, 151644, 872, 198, 9286]  # what the environment appended (tool output), as ids
C2 = [785, 4226, 374, 220, 19, 151645]


def rollout_details(logprobs=True):
    detail = {"prompt_token_ids": [P1, P1 + C1 + ENV], "completion_token_ids": [C1, C2]}
    if logprobs:
        detail["logprobs"] = [[-0.25] * len(C1), [-0.5] * len(C2)]
    return [detail]


def atif(with_tokens=False):
    agent1 = {
        "step_id": 2,
        "source": "agent",
        "message": "let me run it",
        "tool_calls": [{"tool_call_id": "call_1", "function_name": "bash", "arguments": {"command": "ls"}}],
        "observation": {"results": [{"source_call_id": "call_1", "content": "a.txt"}]},
        "metrics": {"prompt_tokens": len(P1), "completion_tokens": len(C1)},
    }
    agent2 = {
        "step_id": 3,
        "source": "agent",
        "message": "The answer is 4",
        "metrics": {"prompt_tokens": len(P1 + C1 + ENV), "completion_tokens": len(C2)},
    }
    if with_tokens:
        agent1["metrics"].update(prompt_token_ids=P1, completion_token_ids=C1, logprobs=[-0.25] * len(C1))
        agent2["metrics"].update(
            prompt_token_ids=P1 + C1 + ENV, completion_token_ids=C2, logprobs=[-0.5] * len(C2)
        )
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": "s-1",
        "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "hosted_vllm/qwen3-8b"},
        "steps": [{"step_id": 1, "source": "user", "message": "what is 2+2?"}, agent1, agent2],
        "final_metrics": {"total_prompt_tokens": 20, "total_completion_tokens": 10},
    }


def write_trial(
    job: Path,
    name: str,
    *,
    task="sum-task",
    rewards=None,
    verifier=True,
    exception=None,
    details=None,
    trajectory=None,
) -> None:
    trial = job / name
    (trial / "agent").mkdir(parents=True)
    (trial / "verifier").mkdir()
    result = {
        "id": f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
        "task_name": task,
        "trial_name": name,
        "trial_uri": f"file://{trial}",
        "task_id": {"path": f"tasks/{task}"},
        "source": "local",
        "task_checksum": "abc",
        "config": {},
        "agent_info": {
            "name": "terminus-2",
            "version": "2.0.0",
            "model_info": {"name": "qwen3-8b", "provider": "hosted_vllm"},
        },
        "agent_result": {
            "n_input_tokens": 40,
            "n_output_tokens": 10,
            "cost_usd": None,
            "rollout_details": details,
            "metadata": {},
        },
        "verifier_result": {"rewards": rewards} if verifier else None,
        "exception_info": None
        if exception is None
        else {
            "exception_type": exception[0],
            "exception_message": exception[1],
            "exception_traceback": "Traceback ...",
            "occurred_at": "2025-11-01T10:00:05",
        },
        "started_at": "2025-11-01T10:00:00",
        "finished_at": "2025-11-01T10:01:00",
        "environment_setup": {"started_at": "2025-11-01T10:00:00", "finished_at": "2025-11-01T10:00:02"},
        "agent_execution": {"started_at": "2025-11-01T10:00:02", "finished_at": "2025-11-01T10:00:50"},
        "verifier": {"started_at": "2025-11-01T10:00:50", "finished_at": "2025-11-01T10:01:00"},
    }
    (trial / "result.json").write_text(json.dumps(result))
    if trajectory is not None:
        (trial / "agent" / "trajectory.json").write_text(json.dumps(trajectory))


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return write_job(tmp_path)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A lake with `write_job`'s job imported as `harbor-run`, shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("harbor")
    lake = Lake(root / "lake")
    import_harbor(lake, write_job(root), "harbor-run")
    yield lake
    lake.close()


def write_job(root: Path) -> Path:
    """A Harbor job directory under `root`: eight trials, one per outcome the taxonomy tells apart."""
    job = root / "jobs" / "2025-11-01__10-00-00"
    job.mkdir(parents=True)
    (job / "result.json").write_text(json.dumps({"id": "job", "n_total_trials": 8}))  # the job's own summary
    (job / "config.json").write_text("{}")
    write_trial(job, "sum-task__a1", rewards={"reward": 1.0}, details=rollout_details(), trajectory=atif())
    write_trial(job, "sum-task__b2", rewards={"reward": 0.0}, details=rollout_details())  # no trajectory file
    write_trial(
        job,
        "sum-task__c3",
        rewards={"reward": 0.0},
        details=rollout_details(),
        trajectory=atif(),
        exception=("AgentTimeoutError", "Agent execution timed out after 900 seconds"),
    )  # exception and reward
    write_trial(
        job, "sum-task__d4", verifier=False, details=rollout_details()
    )  # neither exception nor reward
    write_trial(
        job,
        "sum-task__e5",
        verifier=False,
        details=rollout_details(),
        exception=("RewardFileNotFoundError", "No reward file found at /logs/verifier/reward.txt"),
    )
    write_trial(
        job,
        "sum-task__f6",
        verifier=False,
        details=rollout_details(),
        exception=("ContextLengthExceededError", "maximum context length is 32768 tokens"),
    )
    write_trial(
        job,
        "sum-task__g7",
        rewards={"reward": 0.0},
        details=rollout_details(),
        exception=("RateLimitError", "litellm.RateLimitError: 429 Too Many Requests"),
    )
    write_trial(
        job, "other-task__h8", task="other-task", rewards={"reward": 1.0}, trajectory=atif(with_tokens=True)
    )
    return job


def trajectories(lake, run):
    return {
        r["trial"]: r
        for r in lake.sql(
            "select json_extract_string(e.attributes, '$.trial_name') as trial, t.* "
            "from trajectories t join events e on e.trajectory_id = t.trajectory_id and e.event_type = 'trajectory_started' "
            "where t.run_id = $run",
            {"run": run},
        ).to_pylist()
    }


def test_every_trial_becomes_a_trajectory_with_the_recorded_tokens(lake, job_dir):
    report = import_harbor(lake, job_dir, "harbor-run")
    assert report.trajectories == 8 and report.dead_letters == 0
    rows = trajectories(lake, "harbor-run")
    assert len(rows) == 8
    full = P1 + C1 + ENV + C2
    for name in ["sum-task__a1", "sum-task__b2", "other-task__h8"]:
        assert rows[name]["token_ids"] == full, name
        assert rows[name]["n_turns"] == 2 and rows[name]["tito_drift"] is False
        assert rows[name]["env_tokens"] == len(ENV)  # appended after the prompt
    assert rows["sum-task__a1"]["logprobs"] == [0.0] * len(P1) + [-0.25] * len(C1) + [0.0] * len(ENV) + [
        -0.5
    ] * len(C2)
    assert rows["sum-task__a1"]["n_tool_calls"] == 1 and rows["sum-task__a1"]["n_code_exec"] == 1
    assert rows["sum-task__b2"]["n_tool_calls"] == 0  # no trajectory file: tokens yes, tool calls unknown
    assert [rows[n]["sample_index"] for n in sorted(rows) if n.startswith("sum-task")] == list(range(7))
    assert rows["other-task__h8"]["group_id"] == "other-task"


@pytest.mark.parametrize(
    ("trial", "status", "origin", "label", "reward"),
    [
        ("sum-task__a1", "completed", None, None, 1.0),
        ("sum-task__b2", "completed", None, None, 0.0),
        ("sum-task__c3", "timeout", "model", "model_capability", 0.0),
        ("sum-task__d4", "error", "system", "verifier_error", None),
        ("sum-task__e5", "error", "system", "verifier_error", None),
        ("sum-task__f6", "context_exhausted", "model", "model_capability", None),
        ("sum-task__g7", "error", "system", "infra", None),
    ],
    ids=[
        "ok",
        "no-trajectory-file",
        "exception-and-reward",
        "neither",
        "missing-reward-file",
        "context",
        "rate-limit",
    ],
)
def test_outcomes_follow_the_failure_taxonomy(imported, trial, status, origin, label, reward):
    row = trajectories(imported, "harbor-run")[trial]
    assert (row["status"], row["failure_origin"], row["failure_label"], row["reward"]) == (
        status,
        origin,
        label,
        reward,
    )


def test_counts_by_origin_in_sql(imported):
    rows = imported.sql(
        "select coalesce(failure_origin, 'none') as o, count(*) as n from trajectories where run_id = 'harbor-run' group by 1"
    ).to_pylist()
    counts = {r["o"]: r["n"] for r in rows}
    assert counts == {"none": 3, "model": 2, "system": 3}


def test_importing_the_same_job_twice_adds_nothing(lake, job_dir):
    import_harbor(lake, job_dir, "harbor-run")
    again = import_harbor(lake, job_dir, "harbor-run")
    assert again.trajectories == 0 and again.skipped_existing == 8
    n = lake.sql("select count(*) as n from trajectories where run_id = 'harbor-run'").column("n")[0].as_py()
    assert n == 8


def test_a_turn_without_logprobs_is_kept_with_no_loss(lake, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    write_trial(job, "t__1", rewards={"reward": 1.0}, details=rollout_details(logprobs=False))
    report = import_harbor(lake, job, "nolp")
    row = lake.sql("select token_ids, loss_mask from trajectories where run_id = 'nolp'").to_pylist()[0]
    assert row["token_ids"] == P1 + C1 + ENV + C2
    assert not any(row["loss_mask"])
    assert any("no logprobs" in w for w in report.warnings)


def test_the_cli_imports_a_job_and_prints_plain_progress_when_piped(lake, job_dir, capsys):
    from trajlake.cli import main

    code = main(["import", "harbor", str(job_dir), "--lake", lake.root, "--run", "cli-run"])
    captured = capsys.readouterr()
    assert code == 0
    assert "imported 8 trajectories" in captured.out and "0 dead letters" in captured.out
    assert "harbor trials: 8/8 trials" in captured.err  # a plain line, no bar: stderr is not a TTY
    n = lake.sql("select count(*) as n from trajectories where run_id = 'cli-run'").column("n")[0].as_py()
    assert n == 8
    # 3 of 8 trials are system failures: the doctor says the harness needs fixing
    assert main(["doctor", "--lake", lake.root, "--run", "cli-run"]) == 1
    assert "verifier_error" in capsys.readouterr().out


def test_the_cli_names_the_fix_for_a_directory_without_trials(lake, tmp_path, capsys):
    from trajlake.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["import", "harbor", str(tmp_path / "empty"), "--lake", lake.root, "--run", "r"]) == 2
    assert "no trial directories" in capsys.readouterr().err


def test_a_trial_without_token_ids_keeps_its_replies_as_text_and_is_flagged(lake, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    write_trial(job, "t__1", rewards={"reward": 1.0}, trajectory=atif())  # an agent without rollout details
    report = import_harbor(lake, job, "text")
    row = lake.sql(
        "select token_ids, n_turns, status, reward from trajectories where run_id = 'text'"
    ).to_pylist()[0]
    assert (row["token_ids"], row["n_turns"], row["status"], row["reward"]) == ([], 2, "completed", 1.0)
    turns = lake.sql(
        "select attributes from events where event_type = 'turn' and run_id = 'text' order by seq"
    ).to_pylist()
    assert [json.loads(t["attributes"]) for t in turns] == [
        {"tokens_recorded": False, "completion": "let me run it"},
        {"tokens_recorded": False, "completion": "The answer is 4"},
    ]
    assert any("no token ids" in w for w in report.warnings)
