"""The Health page rendered with AppTest on the synthetic runs: the alert is shown where it began,
a healthy run shows none, and the figures per window match SQL."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from tests.health_runs import ONSET, build_health_lake
from trajlake.dashboards.commands import APP
from trajlake.dashboards.metrics import MISMATCH_THRESHOLD

pytestmark = pytest.mark.integration  # renders the whole Streamlit app (AppTest)


@pytest.fixture(scope="module")
def health_lake(tmp_path_factory):
    """The synthetic runs of tests/health_runs.py (shared, read-only)."""
    return build_health_lake(tmp_path_factory.mktemp("health-page") / "lake")


def render(lake, monkeypatch, run_id: str) -> AppTest:
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = "health"
    at.query_params["run"] = run_id
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_health_page_shows_the_alert_and_where_it_began(health_lake, monkeypatch):
    at = render(health_lake, monkeypatch, "entropy")
    assert at.header[0].value == "Health signals"
    assert len(at.warning) == 1
    assert at.warning[0].value.startswith(f"entropy collapse from steps {ONSET}–{ONSET + 4}:")
    shown = {m.label: m.value for m in at.metric}
    assert shown["entropy collapse"] == f"from {ONSET}" and shown["tool-error spike"] == "ok"
    assert len(at.get("vega_lite_chart")) == 6


def test_the_health_page_of_a_healthy_run_has_no_alert(health_lake, monkeypatch):
    at = render(health_lake, monkeypatch, "healthy")
    assert not at.warning
    assert at.success[0].value.startswith("No alerts")


def test_the_health_windows_match_sql(health_lake, monkeypatch):
    at = render(health_lake, monkeypatch, "mismatch")
    shown = next(d.value for d in at.dataframe if "mismatch" in d.value.columns).set_index("start")
    expected = health_lake.sql(
        """select step // 5 * 5 as start, avg(mismatch) as mismatch from trainer_steps
           where run_id = $run group by 1""",
        {"run": "mismatch"},
    ).to_pylist()
    assert len(shown) == len(expected)
    for row in expected:
        assert shown.loc[row["start"], "mismatch"] == pytest.approx(row["mismatch"])


def test_the_health_pages_mismatch_is_drawn_on_a_log_axis_with_its_threshold(health_lake, monkeypatch):
    at = render(health_lake, monkeypatch, "mismatch")
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    (layers,) = [
        s["layer"]
        for s in specs
        if ["mismatch"] in [t.get("fold") for t in s.get("layer", [{}])[0].get("transform", [])]
    ]
    assert layers[0]["encoding"]["y"]["scale"] == {"type": "log"}
    assert layers[1]["encoding"]["y"] == {"datum": MISMATCH_THRESHOLD}
