"""The latency page and its queries: percentiles by policy version, distributions, slowest trajectories."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pyarrow as pa
import pytest

from tests.dashboards.test_app import chart_titles, metric, render
from trajlake.dashboards import metrics
from trajlake.dashboards.latency import MEASURES
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store.lake import Lake

RUN = "dash-run"
PER_TURN = "select policy_version as v, latency_s::double as x from turns where run_id = $run"


def percentiles_by_sql(lake, source: str, run: str = RUN) -> dict[int, dict[str, float]]:
    """p50 / p90 / p99 per version of `source` (`v`, `x`), straight from the public views."""
    table = lake.sql(
        f"""select v, quantile_cont(x, 0.5) as p50, quantile_cont(x, 0.9) as p90, quantile_cont(x, 0.99) as p99
            from ({source}) where x is not null group by v order by v""",
        {"run": run},
    )
    return {r.pop("v"): r for r in table.to_pylist()}


def shown_table(at, column: str):
    """The page's dataframe that has `column`."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def slowest_by_sql(lake, run: str = RUN) -> str:
    return (
        lake.sql(
            """select trajectory_id from turns where run_id = $run
               group by 1 order by sum(latency_s) desc, trajectory_id limit 1""",
            {"run": run},
        )
        .column(0)[0]
        .as_py()
    )


@pytest.fixture(scope="module")
def untimed_lake(tmp_path_factory) -> Lake:
    """A run whose producer recorded no latency: four finished trajectories of two turns."""
    lake = Lake(tmp_path_factory.mktemp("untimed") / "lake")
    bus = InProcessBus(partitions=1)
    recorder = Recorder(bus, "untimed", flush_each_turn=False)
    for i in range(4):
        with recorder.start(f"task-{i}") as traj:
            traj.turn([1, 2, 3], [-0.1] * 3, 0, input_token_ids=[5, 6])
            traj.turn([4] * (i + 1), [-0.2] * (i + 1), 0, input_token_ids=[7])
            traj.reward(1.0)
            traj.finish("completed")
    DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.0)
    return lake


@pytest.mark.integration  # renders the whole Streamlit app (AppTest)
def test_latency_page_shows_percentiles_per_version_that_match_sql(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "latency")
    expected = {
        "latency_s": percentiles_by_sql(dash_lake, PER_TURN),
        "output_tokens": percentiles_by_sql(
            dash_lake, "select policy_version as v, len(output_token_ids) as x from turns where run_id = $run"
        ),
        "tokens": percentiles_by_sql(
            dash_lake,
            """select policy_version_min as v, len(token_ids) as x from trajectories
               where run_id = $run and finished""",
        ),
        "turns": percentiles_by_sql(
            dash_lake,
            "select policy_version_min as v, n_turns as x from trajectories where run_id = $run and finished",
        ),
    }
    shown = shown_table(at, "p99").set_index(["measure", "policy_version"])
    assert sorted(set(shown.index.get_level_values("measure"))) == sorted(MEASURES)
    for measure, by_version in expected.items():
        for v, figures in by_version.items():
            for p, value in figures.items():
                assert shown.loc[(measure, v), p] == pytest.approx(value, rel=1e-6), (measure, v, p)
    latest = expected["latency_s"][max(expected["latency_s"])]
    assert metric(at, "Latency p50") == f"{latest['p50']:.2f} s"
    assert metric(at, "Latency p99") == f"{latest['p99']:.2f} s"
    titles = chart_titles(at)
    for measure in MEASURES.values():
        assert f"{measure.title}: p50 / p90 / p99" in titles
    assert "Generation latency per request (s), by policy version" in titles
    assert not at.info  # every turn of a loadgen run carries its latency


@pytest.mark.integration  # renders the whole Streamlit app (AppTest)
def test_the_slowest_trajectory_comes_first_and_its_link_opens_the_browser_on_it(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "latency")
    slowest = shown_table(at, "generation_s")
    first = slowest["trajectory_id"].iloc[0]
    assert first == slowest_by_sql(dash_lake)
    assert list(slowest["generation_s"]) == sorted(slowest["generation_s"], reverse=True)

    link = dict(parse_qsl(slowest["open"].iloc[0].lstrip("?")))
    assert link == {"page": "browser", "run": RUN, "trajectory": first}
    browser = render(dash_lake, monkeypatch, **link)
    assert browser.selectbox(key="browser_open").value == first
    assert f"Trajectory {first}" in [s.value for s in browser.subheader]
    n_turns = dash_lake.sql("select n_turns from trajectories where trajectory_id = $t", {"t": first})
    assert metric(browser, "Turns") == str(n_turns.column(0)[0].as_py())
    other = next(t for t in browser.selectbox(key="browser_open").options if t != first)
    browser.selectbox(key="browser_open").set_value(other).run()  # picking another leaves the link
    assert f"Trajectory {other}" in [s.value for s in browser.subheader]
    assert "trajectory" not in browser.query_params


@pytest.mark.integration  # renders the whole Streamlit app (AppTest)
def test_latency_page_follows_the_version_range(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "latency")
    at.select_slider(key=f"versions:{RUN}").set_value((1, 2)).run()
    assert not at.exception
    assert set(shown_table(at, "p99")["policy_version"]) == {1, 2}
    assert set(shown_table(at, "generation_s")["policy_version"]) <= {1, 2}
    at.radio(key="latency_measure").set_value("turns").run()
    assert not at.exception
    assert "Turns per trajectory, by policy version" in chart_titles(at)


@pytest.mark.integration  # renders the whole Streamlit app (AppTest)
def test_a_run_without_recorded_latency_says_so_and_still_shows_lengths(untimed_lake, monkeypatch):
    at = render(untimed_lake, monkeypatch, "latency")
    notes = " ".join(i.value for i in at.info)
    assert "No generation latencies yet" in notes and "latency_s" in notes
    assert metric(at, "Latency p99") == "–"
    assert metric(at, "Turns / trajectory p50") == "2.0"
    assert metric(at, "Output tokens / turn p50") == "3"  # outputs of 3, 3, 3, 3 and 1, 2, 3, 4 tokens
    titles = chart_titles(at)
    assert "Output tokens per turn: p50 / p90 / p99" in titles
    assert not any(t.startswith("Generation latency") for t in titles)
    assert at.radio(key="latency_measure").options == [
        m.title for k, m in MEASURES.items() if k != "latency_s"
    ]
    assert not [d for d in at.dataframe if "generation_s" in d.value.columns]


def test_histogram_bins_hold_every_value_once_up_to_the_largest(dash_lake):
    figures = metrics.length_percentiles(dash_lake, RUN).to_pylist()
    for measure in MEASURES:
        hist = metrics.length_histogram(dash_lake, RUN, measure).to_pylist()
        for row in (r for r in figures if r["measure"] == measure):
            bins = [b for b in hist if b["policy_version"] == row["policy_version"]]
            assert sum(b["n"] for b in bins) == row["n"]
            assert sum(b["share"] for b in bins) == pytest.approx(1.0)
        top = max(r["max"] for r in figures if r["measure"] == measure)
        assert (
            max(b["bin_start"] for b in hist) <= top <= max(b["bin_end"] for b in hist)
        )  # the top bin holds the max
    with pytest.raises(ValueError, match="measure must be one of"):
        metrics.length_histogram(dash_lake, RUN, "reward")


def test_metrics_report_carries_latency_and_length_percentiles(dash_lake):
    report = metrics.metrics_report(dash_lake, RUN)
    expected = percentiles_by_sql(dash_lake, PER_TURN)
    for version in report["versions"]:
        want = expected[version["policy_version"]]
        assert version["latency_s_p50"] == pytest.approx(want["p50"], rel=1e-6)
        assert version["latency_s_p99"] == pytest.approx(want["p99"], rel=1e-6)
        assert {"output_tokens_p90", "tokens_p50", "turns_p99"} <= set(version)
    assert report["slowest_trajectories"][0]["trajectory_id"] == slowest_by_sql(dash_lake)


def test_slowest_trajectories_of_a_lake_projected_before_their_latency_sums(tmp_path, monkeypatch):
    from trajlake.store import lake as lake_module
    from trajlake.store.projections import rebuild

    def record(root, trajectory_id, latencies):
        bus = InProcessBus()
        with Recorder(bus, RUN).start("task", trajectory_id=trajectory_id) as t:
            for i, latency in enumerate(latencies):
                t.turn([4, 5], [-0.5, -0.5], 1, input_token_ids=[i], latency_s=latency)
            t.finish("completed")
        DeltaSink(Lake(root), bus, SinkConfig()).run(until_idle_s=0.0)

    def slowest(lake):
        return [(r["trajectory_id"], r["generation_s"], r["slowest_turn_s"], r["n_timed_turns"])
                for r in metrics.slowest_trajectories(lake, RUN).to_pylist()]  # fmt: skip

    root = tmp_path / "lake"
    schema = lake_module.SCHEMAS["trajectories"]
    sums = ("generation_s", "slowest_turn_s", "n_timed_turns")
    with monkeypatch.context() as m:
        older = pa.schema([f for f in schema if f.name not in sums])
        m.setitem(lake_module.SCHEMAS, "trajectories", older)
        record(root, "t-old", [2.0, 3.0])
    assert not set(sums) & set(Lake(root).stored_columns("trajectories"))
    assert slowest(Lake(root)) == [("t-old", 5.0, 3.0, 2)]  # summed from turns
    record(root, "t-new", [1.0, None])  # the columns are added; the old trajectory's stay null
    expected = [("t-old", 5.0, 3.0, 2), ("t-new", 1.0, 1.0, 1)]
    assert slowest(Lake(root)) == expected
    assert slowest_by_sql(Lake(root)) == "t-old"
    rebuild(Lake(root))
    lake = Lake(root)
    assert lake.sql("select count(*) from trajectories where n_timed_turns is null").column(0)[0].as_py() == 0
    assert slowest(lake) == expected  # from the trajectories' own sums now
