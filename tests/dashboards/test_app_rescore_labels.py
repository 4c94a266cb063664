"""The Re-scoring page, the browser's labelling form and its search box, rendered with AppTest."""

from __future__ import annotations

import json
import textwrap

import pytest
from streamlit.testing.v1 import AppTest

from tests.dashboards.conftest import build_lake
from tests.dashboards.test_app import metric
from tests.dashboards.test_app import render as render_page
from trajlake.cli import main
from trajlake.store.search import SearchQuery, search

pytestmark = pytest.mark.integration  # renders the whole Streamlit app (AppTest)

RUN = "dash-rescore"


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """32 loadgen trajectories (no trainer) of run `dash-rescore`, of this module's own: its tests write labels."""
    lake = build_lake(tmp_path_factory.mktemp("dash-rescore") / "lake", trajectories=32, trainer=False,
                      run_id=RUN, group_size=4)  # fmt: skip
    yield lake
    lake.close()


def render(lake, monkeypatch, page: str, **query) -> AppTest:
    """The page of run `dash-rescore`, rendered (`test_app.render`)."""
    return render_page(lake, monkeypatch, page, run=RUN, **query)


def test_the_rescoring_page_counts_and_lists_the_flips_the_cli_reported(lake, monkeypatch, tmp_path, capsys):
    verifier = tmp_path / "inverted.py"
    verifier.write_text(textwrap.dedent("""
        def inverted(traj):
            return 1.0 - traj.reward if traj.reward is not None else 1.0
    """))  # fmt: skip
    capsys.readouterr()
    assert main(["rescore", "--lake", lake.root, "--run", RUN, "--verifier", f"{verifier}:inverted",
                 "--verifier-version", "inv", "--format", "json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    at = render(lake, monkeypatch, "rescore")
    assert at.header[0].value == "Re-scoring"
    assert metric(at, "Fail → pass") == f"{report['fail_to_pass']:,}"
    assert metric(at, "Pass → fail") == f"{report['pass_to_fail']:,}"
    listed = next(d.value for d in at.dataframe if "flip" in d.value.columns)
    recorded = set(
        lake.sql("select trajectory_id from rewards where verifier_version is null").column(0).to_pylist()
    )
    # the page compares the trajectories both versions scored (the report also lists those scored only now)
    assert set(listed["trajectory_id"]) == {f["trajectory_id"] for f in report["flips"]} & recorded
    assert len(listed) == report["fail_to_pass"] + report["pass_to_fail"] > 0


def test_the_browser_labels_the_open_trajectory(lake, monkeypatch):
    chosen = (
        lake.sql("select trajectory_id from trajectories order by trajectory_id limit 1").column(0)[0].as_py()
    )
    at = render(lake, monkeypatch, "browser", trajectory=chosen)
    at.selectbox(key="label_key").set_value("reward_hack")
    at.text_input(key="label_author").set_value("ann")
    at.button[[b.label for b in at.button].index("Add label")].click().run()
    assert not at.exception, [e.value for e in at.exception]
    labels = lake.sql("select trajectory_id, key, value, author from current_labels").to_pylist()
    assert labels == [{"trajectory_id": chosen, "key": "reward_hack", "value": "true", "author": "ann"}]
    assert "Label 'reward_hack' = 'true' on the trajectory." in [s.value for s in at.success]
    shown = next(d.value for d in at.dataframe if "key" in d.value.columns and "author" in d.value.columns)
    assert list(shown["key"]) == ["reward_hack"]
    failures = render(lake, monkeypatch, "failures")  # the Failures page counts it, by outcome
    titles = [json.loads(c.proto.spec).get("title", "") for c in failures.get("vega_lite_chart")]
    assert any("Labelled trajectories by label and outcome" in json.dumps(t) for t in titles)


def test_the_browser_search_box_counts_token_ids_like_the_cli(lake, monkeypatch):
    ids = lake.sql("select output_token_ids[1:2] as p from turns where len(output_token_ids) > 2 limit 1")
    pattern = ids.column("p")[0].as_py()
    expected = search(lake, SearchQuery(RUN, tokens=tuple(pattern)))
    at = render(lake, monkeypatch, "browser")
    at.radio(key="search_kind").set_value("token ids")
    at.text_input(key="search_pattern").set_value(",".join(map(str, pattern)))
    at.button[[b.label for b in at.button].index("Search")].click().run()
    assert not at.exception, [e.value for e in at.exception]
    said = f"{expected.matches:,} matches in {expected.turns_hit:,} turns of {expected.trajectories_hit:,} trajectories"
    assert any(said in c.value for c in at.caption)
    versions = next(d.value for d in at.dataframe if {"policy_version", "matches"} <= set(d.value.columns))
    assert int(versions["matches"].sum()) == expected.matches >= 1
