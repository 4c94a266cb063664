"""`trajlake metrics` and `trajlake dashboard`: the CLI shows the dashboard's figures."""

from __future__ import annotations

import csv
import io
import json

import pytest
from streamlit.testing.v1 import AppTest

from tests.dashboards.conftest import THIN_RUN
from trajlake.cli import build_parser, main
from trajlake.dashboards import metrics
from trajlake.dashboards.commands import APP, streamlit_command

RUN = "dash-run"


def metrics_json(lake, capsys) -> dict:
    assert main(["metrics", "--lake", lake.root, "--run", RUN, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _rounded(value, digits: int = 12):
    """`value` with every float rounded to `digits` places, through dicts and lists."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return value


def test_metrics_json_is_the_dashboard_report(dash_lake, capsys):
    printed = metrics_json(dash_lake, capsys)
    expected = json.loads(json.dumps(metrics.metrics_report(dash_lake, RUN), default=str))
    # DuckDB sums in parallel, so two runs of one average may differ in the last bit
    assert _rounded(printed) == _rounded(expected)
    assert [v["policy_version"] for v in printed["versions"]] == [0, 1, 2, 3]
    assert [r["k"] for r in printed["pass_at_k"]] == list(range(1, 17))
    assert {"k", "pass_at_k", "n_tasks", "n_tasks_total"} == set(printed["pass_at_k"][0])


@pytest.mark.integration  # renders the whole Streamlit app (AppTest)
def test_metrics_match_the_figures_the_app_shows(dash_lake, capsys, monkeypatch):
    printed = metrics_json(dash_lake, capsys)
    monkeypatch.setenv("TRAJLAKE_LAKE", dash_lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = "overview"
    at.run()
    shown = at.dataframe[0].value.to_dict("records")
    for row, version in zip(shown, printed["versions"], strict=True):
        for column in ("policy_version", "n_trajectories", "n_scored", "reward_mean", "n_tasks"):
            assert row[column] == pytest.approx(version[column])
        assert (
            row["pass_at_1"] == pytest.approx(version["pass_at_1"], nan_ok=True)
            or version["pass_at_1"] is None
        )
    pass1 = next(m.value for m in at.metric if m.label == "pass@1")
    assert pass1 == f"{printed['pass_at_k'][0]['pass_at_k']:.3f}"


def test_metrics_table_prints_a_line_per_version(dash_lake, capsys):
    assert main(["metrics", "--lake", dash_lake.root, "--run", RUN]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(" | ")[:3] == ["policy_version", "n_trajectories", "n_scored"]
    assert [line.split()[0] for line in lines[2:6]] == ["0", "1", "2", "3"]
    assert lines[-1].startswith(f"run {RUN}: pass@1=")
    assert "(12 tasks)" in lines[-1]  # each value beside the tasks it stands on


def test_metrics_show_zero_signal_groups_per_trainer_step(signal_lake, capsys):
    assert main(["metrics", "--lake", signal_lake.root, "--run", "signal-run", "--format", "json"]) == 0
    steps = json.loads(capsys.readouterr().out)["zero_signal_groups"]
    counted = [(s["step"], s["n_groups"], s["n_zero_signal_groups"]) for s in steps]
    assert counted == [(0, 3, 0), (1, 3, 1), (2, 3, 3)]
    assert main(["metrics", "--lake", signal_lake.root, "--run", "signal-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith(
        "zero-signal groups (all rewards equal): 4 of 9 consumed (44.4%) over 3 steps; step 2: 3 of 3"
    )


def test_metrics_csv_has_a_row_per_version(dash_lake, capsys):
    assert main(["metrics", "--lake", dash_lake.root, "--run", RUN, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["policy_version"] for r in rows[:4]] == ["0", "1", "2", "3"]


def test_metrics_names_the_runs_there_when_the_run_is_unknown(dash_lake, capsys):
    assert main(["metrics", "--lake", dash_lake.root, "--run", "nope"]) == 2
    assert f"runs there: {RUN}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["metrics", "dashboard"])
def test_commands_say_how_to_fill_a_missing_lake(tmp_path, capsys, command):
    args = [command, "--lake", str(tmp_path / "nowhere")] + (["--run", RUN] if command == "metrics" else [])
    assert main(args) == 2
    assert "trajlake loadgen" in capsys.readouterr().err


def test_dashboard_binds_to_localhost_headless_without_usage_stats(monkeypatch):
    for name in ("TRAJLAKE_HOST", "TRAJLAKE_PORT"):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args(["dashboard"])
    command = streamlit_command(args)
    option = dict(zip(command[5::2], command[6::2], strict=True))
    assert command[3:5] == ["run", str(APP.resolve())]
    assert option["--server.address"] == "127.0.0.1"
    assert option["--server.headless"] == "true"
    assert option["--browser.gatherUsageStats"] == "false"
    assert option["--server.port"] == "8501"


def test_dashboard_port_and_host_read_their_env_vars(monkeypatch):
    monkeypatch.setenv("TRAJLAKE_PORT", "9123")
    monkeypatch.setenv("TRAJLAKE_HOST", "0.0.0.0")
    args = build_parser().parse_args(["dashboard"])
    assert (args.host, args.port) == ("0.0.0.0", 9123)  # resolved from the env when the command parses


OTHER = "dash-run-b"
SCORED = "t.finished and t.reward is not null and coalesce(t.failure_origin, '') <> 'system'"


def test_metrics_runs_json_overlays_the_runs_like_sql(two_runs_lake, capsys):
    assert (
        main(["metrics", "--lake", two_runs_lake.root, "--runs", f"{RUN},{OTHER}", "--format", "json"]) == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in printed["summary"]] == [RUN, OTHER]
    versions = two_runs_lake.sql(
        f"""select run_id, policy_version_min as policy_version, count(*) as n_trajectories,
                   avg(reward) filter (where {SCORED}) as reward_mean,
                   avg(n_turns) filter (where t.finished) as turns_per_trajectory,
                   avg(coalesce(failure_origin = 'system', false)::int) as system_failure_rate
            from trajectories t where policy_version_min is not null group by all"""
    ).to_pylist()
    versions.sort(key=lambda r: ([RUN, OTHER].index(r["run_id"]), r["policy_version"]))
    assert [(r["run_id"], r["policy_version"]) for r in printed["by_version"]] == [
        (r["run_id"], r["policy_version"]) for r in versions
    ]
    for shown, row in zip(printed["by_version"], versions, strict=True):
        for column in ("n_trajectories", "reward_mean", "turns_per_trajectory", "system_failure_rate"):
            assert shown[column] == pytest.approx(row[column]), (row["run_id"], row["policy_version"], column)
    steps = two_runs_lake.sql(
        """select b.run_id, b.step, avg(b.staleness) as staleness_mean, max(s.entropy) as entropy
           from batch_consumption b
           join (select run_id, step, avg(entropy) as entropy from trainer_steps group by all) s using (run_id, step)
           group by all"""
    ).to_pylist()
    steps.sort(key=lambda r: ([RUN, OTHER].index(r["run_id"]), r["step"]))
    assert [(r["run_id"], r["step"]) for r in printed["by_step"]] == [(r["run_id"], r["step"]) for r in steps]
    for shown, row in zip(printed["by_step"], steps, strict=True):
        assert shown["staleness_mean"] == pytest.approx(row["staleness_mean"])
        assert shown["entropy"] == pytest.approx(row["entropy"])
    curve = {r["k"]: r["pass_at_k"] for r in printed["pass_at_k"] if r["run_id"] == RUN}
    assert curve == pytest.approx(
        {r["k"]: r["pass_at_k"] for r in metrics.pass_at_k_curve(two_runs_lake, RUN).to_pylist()}
    )


def test_metrics_runs_table_prints_a_line_per_run_and_version_then_one_per_run(two_runs_lake, capsys):
    assert main(["metrics", "--lake", two_runs_lake.root, "--runs", f"{OTHER},{RUN}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(" | ")[:2] == ["run_id    ", "policy_version"]
    assert [line.split()[0] for line in lines[2:10]] == [OTHER] * 4 + [RUN] * 4
    assert lines[-2].startswith(f"run {OTHER}: pass@1=") and lines[-1].startswith(f"run {RUN}: pass@1=")


def test_metrics_runs_csv_by_step_has_a_row_per_run_and_step(two_runs_lake, capsys, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_RUNS", f"{RUN}, {OTHER}")  # the env var, spaces and all
    assert main(["metrics", "--lake", two_runs_lake.root, "--by", "step", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["run_id"], r["step"]) for r in rows] == [
        (run, str(s)) for run in (RUN, OTHER) for s in range(3)
    ]
    # step 0: the mean of ranks at 0.010 and 0.012; step 2: of 0.040 and 0.042
    assert {r["mismatch"] for r in rows} >= {"0.011", "0.041"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", RUN, "--runs", f"{RUN},{OTHER}"], "pass --run or --runs, not both"),
        ([], "say which runs: --run RUN for one run's figures, or --runs A,B,... to compare runs"),
        (["--runs", f"{RUN},nope,nada"], "runs 'nope', 'nada' are not in"),
        (["--runs", "nope"], "run 'nope' is not in"),
        (["--run", RUN, "--by", "step"], f"pass --runs {RUN} --by step"),
    ],
    ids=["both", "neither", "unknown-runs", "unknown-run", "by-step-of-one-run"],
)
def test_metrics_says_how_to_choose_runs(two_runs_lake, capsys, monkeypatch, args, message):
    monkeypatch.delenv("TRAJLAKE_RUN", raising=False)
    monkeypatch.delenv("TRAJLAKE_RUNS", raising=False)
    assert main(["metrics", "--lake", two_runs_lake.root, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trajlake metrics: error: ") and message in err
    if "not both" not in message and "--by" not in message:
        assert f"runs there: {OTHER}, {RUN}" in err


def test_dashboard_refuses_a_tokenizer_that_does_not_load_before_serving(bare_lake, tmp_path, capsys):
    missing = tmp_path / "no-model"
    assert main(["dashboard", "--lake", bare_lake.root, "--tokenizer", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer {missing} does not load" in err and "drop --tokenizer" in err
    assert "serving" not in err  # refused before starting Streamlit


def test_metrics_show_a_thin_versions_pass_at_k_as_hidden_with_its_count(thin_lake, capsys):
    args = ["metrics", "--lake", thin_lake.root, "--run", THIN_RUN]
    assert main([*args, "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    v0 = {r["k"]: r for r in printed["versions"][0]["pass_at_k"]}
    assert v0[4] == {"k": 4, "pass_at_k": None, "n_tasks": 1, "n_tasks_total": 12}
    assert printed["versions"][0]["n_tasks"] == 12
    assert printed["versions"][0]["pass_at_k"] == [
        {k: v for k, v in r.items() if k != "policy_version"}
        for r in metrics.pass_at_k_by_version(thin_lake, THIN_RUN).to_pylist()
        if r["policy_version"] == 0
    ]  # the CLI prints what the API computes
    assert main(args) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"run {THIN_RUN}: pass@1=0.2222 (18 tasks)  pass@2=0.8571 (7 of 18 tasks)")
    assert last.endswith("pass@5..6 hidden: only 1 of 18 tasks has >= 5 scored samples (min_tasks 5)")
    assert main([*args, "--min-tasks", "1", "--format", "json"]) == 0  # the user's own bar
    v0 = {r["k"]: r for r in json.loads(capsys.readouterr().out)["versions"][0]["pass_at_k"]}
    assert (v0[4]["pass_at_k"], v0[4]["n_tasks"]) == (1.0, 1)


@pytest.mark.integration  # renders the whole Streamlit app (AppTest)
def test_cli_api_and_dashboard_agree_on_a_thin_versions_pass_at_k(thin_lake, capsys, monkeypatch):
    api = metrics.pass_at_k_curve(thin_lake, THIN_RUN, (0, 0)).to_pylist()
    assert main(["metrics", "--lake", thin_lake.root, "--run", THIN_RUN, "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)["versions"][0]["pass_at_k"]
    assert cli == [{k: v for k, v in r.items()} for r in api]  # version 0 alone: the same rows
    monkeypatch.setenv("TRAJLAKE_LAKE", thin_lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = "overview"
    at.run()
    at.select_slider(key=f"versions:{THIN_RUN}").set_value((0, 0)).run()
    assert not at.exception
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["pass@1"] == f"{api[0]['pass_at_k']:.3f}" == "0.083"
    assert "pass@4" not in tiles and "1.000" not in tiles.values()  # the one large group's 1.0 is not shown
    captions = " ".join(c.value for c in at.caption)
    assert "k ≥ 2 hidden: only 1 of 12 tasks has >= 2 scored samples (min_tasks 5)" in captions
