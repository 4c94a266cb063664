"""`trajlake metrics` and `trajlake dashboard`: the CLI shows the dashboard's figures."""

from __future__ import annotations

import csv
import io
import json

import pytest
from streamlit.testing.v1 import AppTest

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
    assert set(printed["pass_at_k"]) == {str(k) for k in range(1, 17)}


def test_metrics_match_the_figures_the_app_shows(dash_lake, capsys, monkeypatch):
    printed = metrics_json(dash_lake, capsys)
    monkeypatch.setenv("TRAJLAKE_LAKE", dash_lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = "overview"
    at.run()
    shown = at.dataframe[0].value.to_dict("records")
    for row, version in zip(shown, printed["versions"], strict=True):
        for column in ("policy_version", "n_trajectories", "n_scored", "reward_mean", "pass_at_1"):
            assert row[column] == pytest.approx(version[column])
    pass1 = next(m.value for m in at.metric if m.label == "pass@1")
    assert pass1 == f"{printed['pass_at_k']['1']:.3f}"


def test_metrics_table_prints_a_line_per_version(dash_lake, capsys):
    assert main(["metrics", "--lake", dash_lake.root, "--run", RUN]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(" | ")[:3] == ["policy_version", "n_trajectories", "n_scored"]
    assert [line.split()[0] for line in lines[2:6]] == ["0", "1", "2", "3"]
    assert lines[-1].startswith(f"run {RUN}: pass@1=")


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


def test_dashboard_refuses_a_tokenizer_that_does_not_load_before_serving(bare_lake, tmp_path, capsys):
    missing = tmp_path / "no-model"
    assert main(["dashboard", "--lake", bare_lake.root, "--tokenizer", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer {missing} does not load" in err and "drop --tokenizer" in err
    assert "serving" not in err  # refused before starting Streamlit
