"""The Streamlit app rendered with AppTest on a small lake; figures shown are checked against SQL."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from trajlake.dashboards import metrics
from trajlake.dashboards.app import PAGES
from trajlake.dashboards.commands import APP
from trajlake.dashboards.views.charts import PALETTE
from trajlake.dashboards.views.compare import BY_STEP, BY_VERSION

pytestmark = pytest.mark.integration  # renders the whole Streamlit app (AppTest)

RUN = "dash-run"
OTHER = "dash-run-b"
CHARTS_PER_PAGE = {
    "overview": 2,
    "entropy": 2,
    "behaviour": 5,
    "failures": 4,
    "async": 4,
    "compare": 15,  # a small chart per measure by version (7) and step (9), pass@k; pass@1 hidden twice here
    "latency": 5,
    "health": 4,
    "rescore": 0,
    "browser": 0,
    "sql": 0,
}


def render(lake, monkeypatch, page: str, **query) -> AppTest:
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    monkeypatch.delenv("TRAJLAKE_TOKENIZER", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = page
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def charts(at: AppTest) -> list:
    return list(at.get("vega_lite_chart"))


def title_of(spec: dict) -> str:
    """A chart's title as one line (charts wrap theirs into lines that fit)."""
    title = spec.get("title", "")
    return " ".join(title["text"]) if isinstance(title, dict) else title


def chart_titles(at: AppTest) -> list[str]:
    return [title_of(json.loads(c.proto.spec)) for c in charts(at)]


@pytest.mark.parametrize("page", list(PAGES), ids=list(PAGES))
def test_every_page_renders_its_charts_without_an_exception(dash_lake, monkeypatch, page):
    at = render(dash_lake, monkeypatch, page)
    assert at.header[0].value == PAGES[page][0]
    assert len(charts(at)) >= CHARTS_PER_PAGE[page]
    if page != "browser":  # the browser shows the opened trajectory's own errors
        assert not at.error


def test_overview_shows_reward_and_pass_at_1_that_match_sql(dash_lake, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_MIN_TASKS", "1")  # each version has 3 tasks: show every pass@1
    at = render(dash_lake, monkeypatch, "overview")
    scored = dash_lake.sql(
        """select policy_version_min as v, task_id, count(*) as n, count(*) filter (where reward >= 1) as c,
                   sum(reward) as total from trajectories
            where run_id = $run and finished and reward is not null and coalesce(failure_origin, '') <> 'system'
            group by all""",
        {"run": RUN},
    ).to_pylist()
    shown = at.dataframe[0].value.set_index("policy_version")
    for v in sorted({r["v"] for r in scored}):
        tasks = [r for r in scored if r["v"] == v]
        assert shown.loc[v, "n_tasks"] == len(tasks)
        assert shown.loc[v, "pass_at_1"] == pytest.approx(sum(r["c"] / r["n"] for r in tasks) / len(tasks))
        assert shown.loc[v, "reward_mean"] == pytest.approx(
            sum(r["total"] for r in tasks) / sum(r["n"] for r in tasks)
        )
    n_all = (
        dash_lake.sql("select count(*) as n from trajectories where run_id = $run", {"run": RUN})
        .column("n")[0]
        .as_py()
    )
    assert metric(at, "Trajectories") == f"{n_all:,}"
    assert "pass@k and the tasks it covers" in chart_titles(at)
    assert metric(at, "pass@16") != "–"  # groups of 16 reach k = 16, and min_tasks is 1 here


def test_overview_hides_pass_at_1_of_versions_with_too_few_tasks_and_says_why(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "overview")  # the default min_tasks (5); 3 tasks per version
    shown = at.dataframe[0].value
    assert list(shown["n_tasks"]) == [3, 3, 3, 3] and shown["pass_at_1"].isna().all()
    assert any("pass@1 hidden at 4 version(s) scored on fewer than 5 tasks" in c.value for c in at.caption)
    curve = metrics.pass_at_k_curve(dash_lake, RUN).to_pylist()
    top = max(r["k"] for r in curve if r["pass_at_k"] is not None)  # the largest k enough tasks reach
    assert metric(at, f"pass@{top}") == f"{curve[top - 1]['pass_at_k']:.3f}"


def test_entropy_page_shows_the_rollout_estimate_from_the_token_logprobs(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "entropy")
    from_tokens = dash_lake.sql(
        """select policy_version, -sum(list_sum(output_logprobs)) / sum(len(output_token_ids)) as h
            from turns where run_id = $run group by 1 order by 1""",
        {"run": RUN},
    ).to_pylist()
    shown = at.dataframe[0].value
    assert list(shown["policy_version"]) == [r["policy_version"] for r in from_tokens]
    assert list(shown["entropy"]) == pytest.approx([r["h"] for r in from_tokens], rel=1e-6)
    assert metric(at, "Trainer entropy (latest step)") == "0.705"  # steps 2, ranks 0.70 and 0.71


def test_behaviour_page_figures_match_sql(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "behaviour")
    latest = dash_lake.sql(
        """select avg(n_turns) as turns, sum(n_code_exec) / sum(n_tool_calls) as code,
                   1 - sum(n_tool_errors) / sum(n_tool_calls) as ok
            from trajectories where run_id = $run and finished
              and policy_version_min = (select max(policy_version_min) from trajectories)""",
        {"run": RUN},
    ).to_pylist()[0]
    assert metric(at, "Turns / trajectory") == f"{latest['turns']:.2f}"
    assert metric(at, "Code-execution ratio") == f"{latest['code']:.3f}"
    assert metric(at, "Tool success rate") == f"{latest['ok']:.3f}"
    per_tool = dash_lake.sql(
        """select tool_name, avg(ok::int) as rate from tool_calls
            where run_id = $run and has_result group by 1""",
        {"run": RUN},
    ).to_pylist()
    shown = at.dataframe[0].value.set_index("tool_name")
    for row in per_tool:
        assert shown.loc[row["tool_name"], "success_rate"] == pytest.approx(row["rate"])


def test_failures_page_counts_system_and_model_failures_like_sql(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "failures")
    rows = dash_lake.sql(
        "select failure_origin, count(*) as n from trajectories where run_id = $run and finished group by 1",
        {"run": RUN},
    ).to_pylist()
    counts = {row["failure_origin"]: row["n"] for row in rows}
    assert metric(at, "System failures") == f"{counts['system']:,}"
    assert metric(at, "Model failures") == f"{counts['model']:,}"
    assert any("No dead letters" in s.value for s in at.success)


def test_async_health_shows_staleness_mismatch_and_lag(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "async")
    assert metric(at, "Mean staleness") == "1.00"  # batches of 16 at staleness 0, 1, 2
    assert metric(at, "Max staleness") == "2"
    mismatch = next(m for m in at.metric if m.label == "Logprob mismatch (latest step)")
    assert mismatch.value == "0.0410" and "above 0.03" in mismatch.delta
    assert metric(at, "Ingest lag p95 (latest)").endswith(" s")
    titles = chart_titles(at)
    assert "Train/inference logprob mismatch (healthy < 0.03)" in titles
    assert "Arrivals over time (finished trajectories)" in titles
    at.radio(key="buffer_by").set_value("length").run()
    assert not at.exception


def chart_rows(at: AppTest, title: str) -> list[dict]:
    """The data the chart titled `title` draws (Arrow IPC in the element's dataset)."""
    chart = next(c for c in charts(at) if title_of(json.loads(c.proto.spec)) == title)
    return pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_all().to_pylist()


def test_async_health_shows_the_zero_signal_groups_of_each_step(signal_lake, monkeypatch):
    at = render(signal_lake, monkeypatch, "async")
    assert metric(at, "Zero-signal groups (latest step)") == "3 of 3"
    assert metric(at, "Zero-signal share (whole run)") == "44.4%"  # 4 of 9 groups
    drawn = chart_rows(at, "Consumed groups per trainer step, zero signal vs with signal")
    zero = {r["step"]: r["n_groups"] for r in drawn if r["signal"].startswith("zero signal")}
    with_signal = {r["step"]: r["n_groups"] for r in drawn if r["signal"] == "with signal"}
    assert zero == {0: 0, 1: 1, 2: 3} and with_signal == {0: 3, 1: 2, 2: 0}


def test_trainer_pages_show_empty_states_before_the_trainer_writes(bare_lake, monkeypatch):
    at = render(bare_lake, monkeypatch, "entropy")
    assert any("No trainer steps yet" in i.value for i in at.info)
    assert metric(at, "Trainer entropy (latest step)") == "–"
    at = render(bare_lake, monkeypatch, "async")
    notes = " ".join(i.value for i in at.info)
    assert "No consumed batches yet" in notes and "No trainer steps yet" in notes
    assert metric(at, "Mean staleness") == "–"
    assert metric(at, "Zero-signal groups (latest step)") == "–"
    assert len(charts(at)) >= 2  # arrivals and ingest lag still draw


def test_trajectory_browser_opens_one_with_shaded_tokens(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "browser")
    at.multiselect(key="browser_status").set_value(["completed"]).run()
    listed = at.dataframe[0].value
    assert set(listed["status"]) == {"completed"}
    chosen = listed["trajectory_id"].iloc[0]
    at.selectbox(key="browser_open").set_value(chosen).run()
    n_tokens = (
        dash_lake.sql(
            "select len(token_ids) as n from trajectories where trajectory_id = $id", {"id": chosen}
        )
        .column("n")[0]
        .as_py()
    )
    spans = sum(h.proto.body.count('class="tok ') for h in at.get("html"))
    assert spans == n_tokens  # every token of the trajectory, each in its own shaded span
    assert metric(at, "Status") == "completed"


def test_sql_console_runs_read_only_queries_and_refuses_writes(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "sql")
    assert (
        at.dataframe[0].value["trajectories"].sum()
        == dash_lake.sql("select count(*) as n from trajectories where run_id = $run", {"run": RUN})
        .column("n")[0]
        .as_py()
    )
    at.text_area(key="sql_query").set_value("delete from trajectories")
    at.button(key="sql_run").click().run()
    assert "read-only" in at.error[0].value


def test_trajectory_browser_decodes_tokens_with_a_configured_tokenizer(dash_lake, monkeypatch, tmp_path):
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(4096)}, unk_token="w0")).save(str(path))
    monkeypatch.setenv("TRAJLAKE_LAKE", dash_lake.root)
    monkeypatch.setenv("TRAJLAKE_TOKENIZER", str(path))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = "browser"
    at.run()
    assert not at.exception
    chosen = at.selectbox(key="browser_open").value
    first = (
        dash_lake.sql("select token_ids[1] as t from trajectories where trajectory_id = $id", {"id": chosen})
        .column("t")[0]
        .as_py()
    )
    body = at.get("html")[0].proto.body
    assert f'<span class="tok env" title="environment · id {first}" style="' in body
    assert f">w{first}</span>" in body  # the override decodes a run whose model (synthetic-7b) is not here
    assert not at.warning


def test_version_selector_limits_the_overview_to_the_chosen_versions(dash_lake, monkeypatch):
    at = render(dash_lake, monkeypatch, "overview")
    at.select_slider(key=f"versions:{RUN}").set_value((1, 2)).run()
    assert not at.exception
    assert list(at.dataframe[0].value["policy_version"]) == [1, 2]


def test_run_selector_lists_every_run_and_switches_between_them(tmp_path, monkeypatch):
    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.loadgen import LoadgenConfig, generate
    from trajlake.store.lake import Lake

    lake = Lake(tmp_path / "lake")
    for run_id, n in (("older", 8), ("newer", 16)):
        bus = InProcessBus(topic=f"t-{run_id}", partitions=1)
        generate(bus, LoadgenConfig(trajectories=n, run_id=run_id, turns=2, prompt_tokens=8, output_tokens=4))
        DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.0)
    at = render(lake, monkeypatch, "overview")
    assert at.selectbox(key="run").options == ["newer", "older"]
    assert metric(at, "Trajectories") == "16"
    at.selectbox(key="run").set_value("older").run()
    assert metric(at, "Trajectories") == "8"


SCORED = "t.finished and t.reward is not null and coalesce(t.failure_origin, '') <> 'system'"


def test_compare_page_overlays_two_runs_with_figures_that_match_sql(two_runs_lake, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_MIN_TASKS", "1")  # each version has 3 tasks: show every pass@1
    at = render(two_runs_lake, monkeypatch, "compare", runs=f"{RUN},{OTHER}")
    assert at.multiselect(key="compare_runs").value == [RUN, OTHER]
    summary = at.dataframe[0].value.set_index("run_id")
    per_run = two_runs_lake.sql(
        f"""select run_id, count(*) as n, avg(reward) filter (where {SCORED}) as reward
            from trajectories t where policy_version_min is not null group by run_id"""
    ).to_pylist()
    assert sorted(summary.index) == sorted(r["run_id"] for r in per_run) == [RUN, OTHER]
    for row in per_run:
        assert summary.loc[row["run_id"], "n_trajectories"] == row["n"]
        assert summary.loc[row["run_id"], "reward_mean"] == pytest.approx(row["reward"])

    by_version = at.dataframe[1].value.set_index(["run_id", "policy_version"])
    tasks = two_runs_lake.sql(
        f"""select run_id, policy_version_min as v, task_id, count(*) as n,
                   count(*) filter (where reward >= 1) as c
            from trajectories t where {SCORED} group by all"""
    ).to_pylist()
    for key in {(r["run_id"], r["v"]) for r in tasks}:
        shares = [r["c"] / r["n"] for r in tasks if (r["run_id"], r["v"]) == key]
        assert by_version.loc[key, "pass_at_1"] == pytest.approx(sum(shares) / len(shares))

    by_step = at.dataframe[2].value.set_index(["run_id", "step"])
    consumed = two_runs_lake.sql(
        f"""select b.run_id, b.step, count(*) as n, avg(b.staleness) as staleness,
                   avg(t.reward) filter (where {SCORED}) as reward, s.mismatch
            from batch_consumption b join trajectories t on t.trajectory_id = b.trajectory_id
            join (select run_id, step, avg(mismatch) as mismatch from trainer_steps group by all) s
              on s.run_id = b.run_id and s.step = b.step
            group by all"""
    ).to_pylist()
    assert len(by_step) == len(consumed) == 6  # three steps per run
    for row in consumed:
        shown = by_step.loc[(row["run_id"], row["step"])]
        assert shown["n_consumed"] == row["n"]
        assert shown["staleness_mean"] == pytest.approx(row["staleness"])
        assert shown["reward_mean"] == pytest.approx(row["reward"])
        assert shown["mismatch"] == pytest.approx(row["mismatch"])

    specs = [json.loads(c.proto.spec) for c in charts(at)]
    # a small chart per measure, a line per run, each run in the same colour on every chart
    titles = [*BY_VERSION.values(), "pass@k and the tasks it covers", *BY_STEP.values()]
    assert sorted(title_of(s) for s in specs) == sorted(titles)
    colours = {
        json.dumps(layer["encoding"]["color"]["scale"])
        for s in specs
        for layer in s.get("layer", [s])
        if layer["encoding"].get("color", {}).get("field") == "run_id"
    }
    assert colours == {json.dumps({"domain": [RUN, OTHER], "range": list(PALETTE[:2])})}


def test_compare_page_keeps_the_chosen_runs_in_the_url(two_runs_lake, monkeypatch):
    at = render(two_runs_lake, monkeypatch, "compare")
    # by default: the sidebar's run (the newest) and the newest other one
    assert at.multiselect(key="compare_runs").value == [OTHER, RUN]
    assert at.query_params["runs"] == f"{OTHER},{RUN}"
    at.multiselect(key="compare_runs").set_value([RUN]).run()
    assert not at.exception
    assert at.query_params["runs"] == RUN
    assert list(at.dataframe[0].value["run_id"]) == [RUN]
    at.multiselect(key="compare_runs").set_value([]).run()
    assert "runs" not in at.query_params
    assert any("Pick one or more runs" in i.value for i in at.info)


def test_compare_page_leaves_out_unknown_runs_from_the_url_and_says_so(two_runs_lake, monkeypatch):
    at = render(two_runs_lake, monkeypatch, "compare", runs=f"nope,{RUN}")
    assert at.multiselect(key="compare_runs").value == [RUN]
    assert "nope" in at.warning[0].value and OTHER in at.warning[0].value
