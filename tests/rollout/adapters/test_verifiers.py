"""verifiers 0.4 adapter: verifiers' own Trace objects and a real episode (its own venv, the session's
vLLM) recorded through the adapter; `trajlake import verifiers` on the traces.jsonl verifiers writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.examples import printed, run_example, stored
from tests.helpers import same_floats, stored_trajectories
from trajlake.rollout import taxonomy
from trajlake.rollout.adapters.verifiers import (
    UnsupportedVerifiers,
    check_version,
    classify_error,
    installed_version,
    trajectory_id_of,
)


def trajectories(lake_root: Path, run: str) -> dict[str, dict]:
    """Trace id -> its trajectory (row, turns, tools, ended how often), read with a fresh Lake."""
    out = {}
    for row in stored_trajectories(lake_root, run).values():
        row["rounded"] = row["attributes"].get("logprobs_rounded")
        out[row["attributes"]["trace_id"]] = row
    return out


@pytest.fixture(scope="module")
def recorded(run_verifiers, tmp_path_factory) -> dict:
    """verifiers Trace objects (a good one, a retried attempt, a malformed answer, a tokenless one) through the tap."""
    root = tmp_path_factory.mktemp("vf")
    result = run_verifiers(
        "traces", "--lake", str(root / "lake"), "--run-id", "vf-live", "--out", str(root / "out")
    )
    result["root"] = root
    result["rows"] = trajectories(root / "lake", "vf-live")
    return result


@pytest.mark.integration  # a process in the verifiers venv
def test_a_trace_s_turns_keep_the_engine_s_ids_and_logprobs(recorded):
    good = recorded["rows"][recorded["ids"]["good"]]
    nodes = recorded["good_nodes"]
    assert good["status"] == "completed" and good["failure_origin"] is None
    assert good["reward"] == pytest.approx(1.0 + 0.5 * 0.2)
    first, second = good["turns"]
    assert first["input_token_ids"] == [1, 2, 3, 4] and first["output_token_ids"] == [5, 6, 7]
    assert same_floats(first["output_logprobs"], nodes[1]["logprobs"])
    # the second prompt extends the first turn's tokens: only the tool result and scaffold are appended
    assert second["input_token_ids"] == [8, 9, 10] and second["output_token_ids"] == [11, 12]
    assert same_floats(second["output_logprobs"], nodes[3]["logprobs"])
    assert not first["tito_drift"] and not second["tito_drift"]
    assert {t["policy_version"] for t in good["turns"]} == {3}
    assert [t["tool_name"] for t in good["tools"]] == ["calc"] and good["tools"][0]["ok"]


@pytest.mark.integration
def test_every_trace_ends_exactly_once_and_a_retried_attempt_is_a_system_failure(recorded):
    rows = recorded["rows"]
    assert set(rows) == set(recorded["ids"].values())  # the retried attempt too, once
    assert all(r["finished_events"] == 1 for r in rows.values())
    retried = rows[recorded["ids"]["retried"]]
    assert (retried["status"], retried["failure_origin"], retried["failure_label"]) == (
        "error",
        "system",
        "infra",
    )
    assert "retried" in retried["tags"] and "abandoned by a verifiers retry" in retried["message"]
    assert recorded["dead_letters"] == 0


@pytest.mark.integration
def test_a_malformed_model_response_is_a_labelled_failure_not_a_crash(recorded):
    row = recorded["rows"][recorded["ids"]["malformed"]]
    assert (row["status"], row["failure_origin"], row["failure_label"]) == ("error", "system", "infra")
    assert row["reward"] is None and "token_id:111" in row["verifier_error"]


@pytest.mark.integration
def test_a_trace_without_token_ids_is_stored_as_text_and_flagged(recorded):
    row = recorded["rows"][recorded["ids"]["tokenless"]]
    (turn,) = row["turns"]
    assert turn["output_token_ids"] == [] and turn["input_token_ids"] == []
    attributes = json.loads(turn["attributes"])
    assert attributes["tokens_recorded"] is False and attributes["completion"] == "four"
    assert any("no token ids; stored as text" in w for w in recorded["tap"]["warnings"])


@pytest.mark.integration  # a process in the verifiers venv
def test_the_on_delta_tap_records_a_served_episode_and_its_discarded_attempt_once(run_verifiers, tmp_path):
    # the deltas come from verifiers' own DeltaStreamer, through msgpack, as EnvClient.run hands them on
    result = run_verifiers("deltas", "--lake", str(tmp_path / "lake"), "--run-id", "vf-delta")
    rows = trajectories(tmp_path / "lake", "vf-delta")
    assert set(rows) == {result["ids"]["good"], result["ids"]["retried"]} and result["deltas"] >= 3
    assert all(r["finished_events"] == 1 for r in rows.values())
    good, retried = rows[result["ids"]["good"]], rows[result["ids"]["retried"]]
    assert good["status"] == "completed" and [t["output_token_ids"] for t in good["turns"]] == [
        [5, 6, 7],
        [11, 12],
    ]
    assert same_floats(good["turns"][0]["output_logprobs"], [-0.123456789, -1.5, -0.25])  # full precision
    assert "retried" in retried["tags"] and retried["failure_label"] == "infra"
    # a tap given no policy_version (verifiers stamps none on a trace) stores it as unknown, not 0
    assert {t["policy_version"] for t in good["turns"]} == {None} and good["policy_version_min"] is None


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from trajlake.cli import run; run()", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.integration  # CLI processes
def test_import_verifiers_reads_a_vf_eval_traces_file_once(recorded, tmp_path):
    traces = recorded["root"] / "out" / "traces.jsonl"  # written by verifiers' own write_episode
    lake = tmp_path / "lake"
    done = _cli("import", "verifiers", str(traces), "--lake", str(lake), "--run", "vf-import", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["trajectories"], report["turns"], report["dead_letters"]) == (2, 3, 0)
    rows = trajectories(lake, "vf-import")
    good = rows[recorded["ids"]["good"]]
    assert good["trajectory_id"] == trajectory_id_of("vf-import", recorded["ids"]["good"])
    assert good["turns"][0]["output_token_ids"] == [5, 6, 7]
    # the JSON record rounds logprobs to 4 decimals, and the trajectory says so
    assert same_floats(good["turns"][0]["output_logprobs"], [-0.1235, -1.5, -0.25]) and good["rounded"] == 4
    again = json.loads(_cli("import", "verifiers", str(traces.parent), "--lake", str(lake), "--run", "vf-import",
                            "--json").stdout)  # fmt: skip
    assert (again["trajectories"], again["skipped_existing"]) == (0, 2)


@pytest.mark.integration  # a CLI process
def test_an_unknown_verifiers_version_in_a_traces_file_names_the_supported_ones(tmp_path):
    record = {"traces": [{"id": "t1", "version": 1, "verifiers": {"version": "0.3.2"}, "nodes": []}]}
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(record) + "\n")
    done = _cli("import", "verifiers", str(path), "--lake", str(tmp_path / "lake"), "--run", "r")
    assert done.returncode == 2
    assert "verifiers 0.3.2 is not supported" in done.stderr and "verifiers 0.4.x" in done.stderr


def test_the_version_check_names_the_supported_versions():
    check_version("0.4.0", 1)
    check_version("0.4.7")
    for version, trace_version in (("0.3.2", 1), ("1.0.0", 1), (None, 1), ("0.4.0", 2)):
        with pytest.raises(
            UnsupportedVerifiers, match=r"supports verifiers 0\.4\.x \(trace schema version 1\)"
        ):
            check_version(version, trace_version)


def test_without_verifiers_installed_the_tap_says_what_to_install():
    try:
        import verifiers  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedVerifiers, match="verifiers is not installed here"):
            installed_version()
    else:  # pragma: no cover - the project venv does not hold it
        pytest.skip("verifiers is installed in this venv")


@pytest.mark.parametrize(
    ("error", "scoring", "expected"),
    [
        ({"type": "ProviderError", "message": "upstream", "status_code": 503}, False, taxonomy.INFRA_FAILED),
        ({"type": "ProviderError", "message": "maximum context length is 4096", "status_code": 400}, False,
         taxonomy.CONTEXT_EXHAUSTED),
        ({"type": "HarnessError", "message": "exited 1: Error code: 502 - Engine response bad"}, False,
         taxonomy.INFRA_FAILED),
        ({"type": "HarnessError", "message": "harness 'bash' exited 2"}, False, taxonomy.HARNESS_FAILED),
        ({"type": "SandboxError", "message": "exec failed"}, False, taxonomy.INFRA_FAILED),
        ({"type": "ToolsetError", "message": "no server"}, False, taxonomy.TOOL_BROKEN),
        ({"type": "TaskError", "message": "scoring: KeyError"}, True, taxonomy.VERIFIER_FAILED),
        ({"type": "TaskError", "message": "task setup: KeyError"}, False, taxonomy.ENV_FAILED),
        ({"type": "EnvError", "message": "MyEnv.run(): boom"}, False, taxonomy.HARNESS_FAILED),
    ],
)  # fmt: skip
def test_typed_verifiers_errors_map_to_the_failure_taxonomy(error, scoring, expected):
    assert classify_error(error, scoring_started=scoring) is expected


@pytest.mark.integration  # vLLM, a verifiers harness run as a uv script
def test_a_real_episode_is_recorded_live_with_the_server_s_ids_and_logprobs(
    run_verifiers, vllm_server, tmp_path
):
    result = run_verifiers("episode", "--lake", str(tmp_path / "lake"), "--run-id", "vf-real", "--url",
                           vllm_server.url, "--model-dir", str(vllm_server.model_dir), "--model", vllm_server.name,
                           "--shim")  # fmt: skip
    rows = trajectories(tmp_path / "lake", "vf-real")
    assert len(rows) == len(result["traces"]) == 2 and result["dead_letters"] == 0
    answers = result["engine_answers"]  # what vLLM returned, read by the proxy in front of it
    turns = [t for trace in result["traces"] for t in rows[trace["id"]]["turns"]]
    assert len(turns) == len(answers) == 2
    for trace in result["traces"]:
        row = rows[trace["id"]]
        assert row["status"] == "completed" and row["finished_events"] == 1
        nodes = [n for n in trace["nodes"] if n["sampled"]]
        for turn, node in zip(row["turns"], nodes, strict=True):
            assert turn["output_token_ids"] == [
                t for t, m in zip(node["token_ids"], node["mask"], strict=True) if m
            ]
            assert same_floats(turn["output_logprobs"], node["logprobs"])
            assert any(turn["output_token_ids"] == a["token_ids"] and same_floats(turn["output_logprobs"], a["logprobs"])
                       for a in answers)  # fmt: skip


@pytest.mark.integration
def test_an_engine_answer_verifiers_cannot_parse_is_a_labelled_failure(run_verifiers, vllm_server, tmp_path):
    # without the proxy, vLLM 0.32's generate answer lacks the `token` field verifiers 0.4.0's renderers check
    result = run_verifiers("episode", "--lake", str(tmp_path / "lake"), "--run-id", "vf-bad", "--url",
                           vllm_server.url, "--model-dir", str(vllm_server.model_dir), "--model", vllm_server.name,
                           "--episodes", "1")  # fmt: skip
    (trace,) = result["traces"]
    assert not trace["ok"] and trace["errors"] == ["HarnessError"]
    row = trajectories(tmp_path / "lake", "vf-bad")[trace["id"]]
    assert (row["status"], row["failure_origin"], row["failure_label"]) == ("error", "system", "infra")
    assert "must be 'token_id:" in row["message"] and row["finished_events"] == 1


@pytest.mark.integration  # the example as its docs say: a plain `python`, from outside the checkout
def test_the_example_runs_from_a_plain_python_and_reports_what_the_lake_stored(
    verifiers_venv, vllm_server, tmp_path
):
    done = run_example(
        "verifiers", "--lake", str(tmp_path / "lake"), "--vllm-url", vllm_server.url, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = printed(done.stdout)
    assert said == stored(tmp_path / "lake", "verifiers-example")  # tokens as the lake counts them
    assert said["trajectories"] == said["usable"] == 3


@pytest.mark.integration
def test_the_example_exits_1_when_every_rollout_failed_as_a_system_error(
    verifiers_venv, vllm_server, tmp_path
):
    # without the proxy every rollout fails (vLLM 0.32's generate answers lack the field verifiers checks)
    done = run_example("verifiers", "--lake", str(tmp_path / "lake"), "--vllm-url", vllm_server.url, "--no-proxy",
                       cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert printed(done.stdout) == {
        "trajectories": 3,
        "run_id": "verifiers-example",
        "tokens": 0,
        "usable": 0,
    }
    assert "status: 3 error (system: infra)" in done.stdout and "rewards: none, none, none" in done.stdout
    assert "must be 'token_id:" in done.stdout  # why, from the lake's message
