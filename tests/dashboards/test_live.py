"""The live view: `?live=N` reruns the page every N s, and each tick reads the lake's new commits."""

from __future__ import annotations

import pytest
from streamlit.runtime.scriptrunner import RerunData
from streamlit.testing.v1 import AppTest, local_script_runner
from streamlit.testing.v1.local_script_runner import LocalScriptRunner

from tests.dashboards.conftest import RUN_ID, append_trajectories, build_lake, trajectories_in
from trajlake.dashboards.commands import APP

pytestmark = pytest.mark.integration  # renders the whole Streamlit app (AppTest)


class Browser:
    """What the browser does with the app's messages: it keeps the page fragment's `auto_rerun`
    timer, and when it fires asks for a rerun of that fragment alone (not the whole script)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.timers: dict[str, float] = {}  # fragment id -> interval (s), from the last full run
        self.ticking: str | None = None
        forward_msgs = LocalScriptRunner.forward_msgs

        def read_msgs(runner: LocalScriptRunner) -> list:
            msgs = forward_msgs(runner)
            if self.ticking is None:  # a full run sets the timers anew
                self.timers = {
                    m.auto_rerun.fragment_id: m.auto_rerun.interval for m in msgs if m.HasField("auto_rerun")
                }
            return msgs

        def rerun_data(**fields) -> RerunData:  # the runner's requests, aimed at the ticking fragment
            if self.ticking is not None:
                fields.update(fragment_id_queue=[self.ticking], is_auto_rerun=True)
            return RerunData(**fields)

        monkeypatch.setattr(LocalScriptRunner, "forward_msgs", read_msgs)
        monkeypatch.setattr(local_script_runner, "RerunData", rerun_data)

    @property
    def interval_s(self) -> float | None:
        assert len(self.timers) <= 1, self.timers
        return next(iter(self.timers.values()), None)

    def tick(self, at: AppTest) -> AppTest:
        """The live timer fires once: only the page fragment reruns."""
        (self.ticking,) = self.timers
        try:
            at.run()
        finally:
            self.ticking = None
        assert not at.exception, [e.value for e in at.exception]
        return at


def open_app(lake, monkeypatch, page: str = "overview", **query: str) -> AppTest:
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    monkeypatch.delenv("TRAJLAKE_TOKENIZER", raising=False)
    monkeypatch.delenv("TRAJLAKE_LIVE_INTERVAL_S", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update(page=page, **query)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def trajectories_shown(at: AppTest) -> int:
    return int(next(m.value for m in at.metric if m.label == "Trajectories").replace(",", ""))


@pytest.fixture
def live_lake(tmp_path):
    """A small lake of its own: these tests write to it while the app shows it."""
    return build_lake(tmp_path / "lake", trajectories=32, trainer=False)


def test_a_live_tick_shows_trajectories_committed_after_the_first_render(live_lake, monkeypatch):
    browser = Browser(monkeypatch)
    at = open_app(live_lake, monkeypatch, live="10")
    first = trajectories_shown(at)
    assert first == trajectories_in(live_lake) > 0
    assert browser.interval_s == 10
    append_trajectories(live_lake, 16, seed=1)
    browser.tick(at)
    second = trajectories_shown(at)
    assert second == trajectories_in(live_lake) > first
    append_trajectories(live_lake, 16, seed=2)
    browser.tick(at)
    assert trajectories_shown(at) == trajectories_in(live_lake) > second
    assert "Live: read the lake at" in " ".join(c.value for c in at.caption)


def test_reads_are_cached_until_the_lake_has_a_new_commit(live_lake, monkeypatch):
    from trajlake.dashboards import metrics

    calls = []
    real = metrics.overview_by_version
    monkeypatch.setattr(metrics, "overview_by_version", lambda *a, **k: calls.append(1) or real(*a, **k))
    browser = Browser(monkeypatch)
    at = open_app(live_lake, monkeypatch, live="5")
    browser.tick(at)
    browser.tick(at)
    assert len(calls) == 1  # nothing committed: the ticks reuse the first read
    append_trajectories(live_lake, 4, seed=3)
    browser.tick(at)
    assert len(calls) == 2 and trajectories_shown(at) == trajectories_in(live_lake)


def test_the_live_setting_round_trips_through_the_url(live_lake, monkeypatch):
    browser = Browser(monkeypatch)
    at = open_app(live_lake, monkeypatch, live="5")
    assert at.toggle(key="live").value is True
    assert at.number_input(key="live_s").value == 5
    assert at.query_params["live"] == "5" and browser.interval_s == 5

    at.number_input(key="live_s").set_value(30).run()
    assert at.query_params["live"] == "30" and browser.interval_s == 30

    at.toggle(key="live").set_value(False).run()
    assert "live" not in at.query_params and browser.interval_s is None
    assert at.query_params["page"] == "overview"

    at.toggle(key="live").set_value(True).run()
    assert at.query_params["live"] == "30" and browser.interval_s == 30


@pytest.mark.parametrize("value", ["", "0", "-3", "soon"], ids=["empty", "zero", "negative", "word"])
def test_a_url_without_a_whole_number_of_seconds_leaves_live_off(live_lake, monkeypatch, value):
    browser = Browser(monkeypatch)
    at = open_app(live_lake, monkeypatch, live=value)
    assert at.toggle(key="live").value is False
    assert "live" not in at.query_params and browser.interval_s is None
    assert trajectories_shown(at) == trajectories_in(live_lake)


def test_new_policy_versions_stay_in_view_unless_the_range_was_narrowed(live_lake, monkeypatch):
    at = open_app(live_lake, monkeypatch)
    slider = at.select_slider(key=f"versions:{RUN_ID}")
    assert slider.value == (0, 3)
    append_trajectories(live_lake, 16, seed=4)  # loadgen's default: versions 0..7
    at.run()
    assert at.select_slider(key=f"versions:{RUN_ID}").value == (0, 7)
    assert trajectories_shown(at) == trajectories_in(live_lake)
    at.select_slider(key=f"versions:{RUN_ID}").set_value((2, 7)).run()
    append_trajectories(live_lake, 16, seed=5)
    at.run()
    assert at.select_slider(key=f"versions:{RUN_ID}").value == (2, 7)


def test_a_live_tick_brings_a_new_run_and_new_versions_into_the_sidebar(live_lake, monkeypatch):
    browser = Browser(monkeypatch)
    at = open_app(live_lake, monkeypatch, live="10")
    assert at.selectbox(key="run").options == [RUN_ID]
    append_trajectories(live_lake, 16, seed=6)  # versions 0..7 where there were 0..3
    append_trajectories(live_lake, 4, seed=7, run_id="second")
    browser.tick(at)
    assert at.selectbox(key="run").options == ["second", RUN_ID]
    assert at.select_slider(key=f"versions:{RUN_ID}").value == (0, 7)
    assert trajectories_shown(at) == trajectories_in(live_lake)


def test_a_live_empty_lake_opens_the_first_run_once_one_is_committed(tmp_path, monkeypatch):
    from trajlake.store.lake import Lake

    lake = Lake(tmp_path / "lake")
    browser = Browser(monkeypatch)
    at = open_app(lake, monkeypatch, live="3")
    assert "holds no trajectories yet" in at.info[0].value and browser.interval_s == 3
    append_trajectories(lake, 8, seed=8)
    browser.tick(at)
    assert trajectories_shown(at) == trajectories_in(lake) > 0
