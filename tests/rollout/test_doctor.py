"""Tool runner end to end through the Recorder into the lake, and `trajlake doctor` over the result."""

from __future__ import annotations

import json
import time

import pytest

from trajlake.cli import main
from trajlake.ingest.recorder import Recorder
from trajlake.rollout import taxonomy
from trajlake.rollout.config import ToolRunnerConfig
from trajlake.rollout.tools import Tool, ToolRunner


def search(query: str) -> str:
    return " ".join(["result"] * 50)  # long: truncated at a budget of 20 tokens


def python(code: str) -> str:
    if "loop" in code:
        time.sleep(2)
    return "4"


def encode(text: str) -> list[int]:
    return [len(w) for w in text.split()]


def episode(recorder, environment, *, malformed=0, hang=False, system_failure=False, budget=100):
    runner = ToolRunner(
        [Tool("search", search), Tool("python", python, is_code_execution=True, timeout_s=0.2)],
        ToolRunnerConfig(max_output_tokens=20, nudge_threshold=0.8),
        encode=encode,
    )
    with recorder.start("t", environment=environment, context_budget_tokens=budget) as traj:
        prompt = list(range(1, 61))
        traj.turn([7, 8, 9, 10], [-0.1] * 4, policy_version=1, full_input_token_ids=prompt)
        for _ in range(malformed):
            runner.call('{"name": "python", "arguments": ', traj=traj)
        env = runner.call({"name": "search", "arguments": {"query": "x"}}, traj=traj).output_token_ids
        code = runner.call({"name": "python", "arguments": {"code": "loop" if hang else "2+2"}}, traj=traj)
        env += code.output_token_ids
        used = (len(prompt) + 4 + len(env)) / budget
        nudge = runner.nudge(used)
        traj.turn(
            [11, 12],
            [-0.2] * 2,
            policy_version=1,
            input_token_ids=env + ([99] if nudge else []),
            nudged=bool(nudge),
        )
        if system_failure:
            f = taxonomy.INFRA_FAILED
            traj.finish(f.status, failure_origin=f.origin, failure_label=f.label, message="sandbox lost")
        else:
            traj.reward(1.0)
            traj.finish("completed")
    runner.close()


@pytest.fixture
def run_in_lake(lake, bus, drain):
    recorder = Recorder(bus, run_id="doc-run")
    episode(recorder, "web")
    episode(recorder, "web", malformed=2)
    episode(recorder, "code", hang=True)
    episode(recorder, "code", system_failure=True)
    drain()
    return lake


def test_tool_behaviour_is_counted_in_the_lake(run_in_lake):
    lake = run_in_lake
    per_tool = {
        r["tool_name"]: r
        for r in lake.sql(
            "select tool_name, count(*) as calls, count(*) filter (where not ok) as errors, "
            "count(*) filter (where timed_out) as timeouts, count(*) filter (where truncated) as truncated, "
            "sum(retries) as retries, bool_and(is_code_execution) as code "
            "from tool_calls where run_id = 'doc-run' group by 1"
        ).to_pylist()
    }
    assert per_tool["search"]["calls"] == 4 and per_tool["search"]["truncated"] == 4
    assert (
        per_tool["python"]["calls"] == 4
        and per_tool["python"]["timeouts"] == 1
        and per_tool["python"]["code"]
    )
    assert (per_tool["<unparsed>"]["calls"], per_tool["<unparsed>"]["errors"]) == (
        2,
        2,
    )  # the malformed calls
    totals = lake.sql(
        "select sum(n_tool_retries) as retries, sum(n_code_exec) as code, count(*) filter (where nudged) as nudged, "
        "sum(n_nudges) as nudges from trajectories where run_id = 'doc-run'"
    ).to_pylist()[0]
    assert totals["retries"] == 2
    assert totals["code"] == 4
    assert totals["nudged"] == 4 and totals["nudges"] == 4  # each trajectory crossed 80% once


def test_doctor_reports_and_fails_above_the_threshold(run_in_lake, capsys):
    root = run_in_lake.root
    code = main(["doctor", "--lake", root, "--run", "doc-run", "--max-system-error-rate", "0.1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "system failures       1   25.0%" in out
    assert "FAIL: system error rate 25.0% > 10.0%" in out
    assert "python" in out and "search" in out

    code = main(
        ["doctor", "--lake", root, "--run", "doc-run", "--max-system-error-rate", "0.3", "--format", "json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["healthy"] is True
    assert report["totals"]["system_failures"] == 1 and report["totals"]["truncations"] == 4
    assert report["totals"]["tool_timeouts"] == 1 and report["totals"]["nudges"] == 4
    envs = {e["environment"]: e for e in report["by_environment"]}
    assert envs["code"]["system_failures"] == 1 and envs["web"]["system_failures"] == 0
    assert {(f["failure_origin"], f["failure_label"]) for f in report["by_failure"]} == {("system", "infra")}


def test_doctor_tables_fit_the_width_asked_for(run_in_lake, capsys):
    main(["doctor", "--lake", run_in_lake.root, "--run", "doc-run", "--max-width", "60"])
    out = capsys.readouterr().out
    tables = [line for line in out.splitlines() if " | " in line]
    assert tables and all(len(line) <= 60 for line in tables)
    assert "columns hidden; --max-width 0 shows all" in out


def test_doctor_on_an_unknown_run_says_so(run_in_lake, capsys):
    assert main(["doctor", "--lake", run_in_lake.root, "--run", "nope"]) == 2
    assert "no trajectories" in capsys.readouterr().out


def test_doctor_shows_the_engine_mismatch_and_the_drift_apart(run_in_lake, capsys):
    """The overfit check's pattern: one step on tokens of its own weights, then steps on the same
    tokens with newer weights. Their large gap is drift, by staleness, and no fault."""
    from trajlake.trainer.mismatch import write_trainer_steps

    def drift(staleness: int, abs_diff: float) -> dict:
        return {"staleness": staleness, "n_tokens": 50, "abs_diff": abs_diff, "kl": abs_diff / 2}

    rows = [
        {"step": 0, "mismatch": 2e-7, "mismatch_healthy": True, "mismatch_tokens": 50, "drift_tokens": 0},
        {"step": 1, "mismatch_tokens": 0, "drift": 0.4, "drift_kl": 0.2, "drift_tokens": 50,
         "drift_by_staleness": [drift(1, 0.4)]},
        {"step": 2, "mismatch_tokens": 0, "drift": 0.9, "drift_kl": 0.45, "drift_tokens": 50,
         "drift_by_staleness": [drift(2, 0.9)]},
    ]  # fmt: skip
    write_trainer_steps(
        run_in_lake, [{"run_id": "doc-run", "trainer_version": r["step"] + 1, **r} for r in rows]
    )
    code = main(["doctor", "--lake", run_in_lake.root, "--run", "doc-run", "--max-system-error-rate", "0.3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert (
        "engine mismatch  2e-07 over 50 tokens the trainer's own weights generated, in 1 of 3 steps "
        "(worst step 2e-07): healthy (threshold 0.03)"
    ) in out
    assert (
        "policy drift     |Δ logprob| 0.65, KL 0.325 over 100 tokens of older weights "
        "(by staleness: 1: 0.4 (50), 2: 0.9 (50))"
    ) in out
    main(["doctor", "--lake", run_in_lake.root, "--run", "doc-run", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert report["trainer"]["mismatch_tokens"] == 50 and report["trainer"]["drift_tokens"] == 100
    assert [d["staleness"] for d in report["drift_by_staleness"]] == [1, 2]
