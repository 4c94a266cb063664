"""Charts that can be read: distinct hues from one palette, few series, legends that fit, a log axis for mismatch."""

from __future__ import annotations

import colorsys
import itertools
import json
from typing import Any

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from tests.dashboards.conftest import MANY_VERSIONS, RUN_ID
from trajlake.dashboards.app import PAGES
from trajlake.dashboards.commands import APP
from trajlake.dashboards.metrics import MISMATCH_THRESHOLD
from trajlake.dashboards.views import charts
from trajlake.dashboards.views.charts import LOG_FLOOR, MAX_SERIES, PALETTE, TITLE_CHARS


def hue(color: str) -> float:
    r, g, b = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hls(r, g, b)[0] * 360


def test_every_colour_of_the_palette_is_its_own_hue_not_a_shade_of_another():
    # the report: two series told apart by dark vs light blue (the same hue)
    for a, b in itertools.combinations(PALETTE, 2):
        apart = abs(hue(a) - hue(b))
        assert min(apart, 360 - apart) >= 15, (a, b)
    saturation = [colorsys.rgb_to_hls(*(int(c[i : i + 2], 16) / 255 for i in (1, 3, 5)))[2] for c in PALETTE]
    assert min(saturation) > 0.25  # no greys
    assert len(PALETTE) == MAX_SERIES


def drawn(monkeypatch, draw) -> list[dict[str, Any]]:
    """The Vega-Lite specs that `draw()` hands to Streamlit."""
    specs: list[dict[str, Any]] = []
    monkeypatch.setattr(charts.st, "altair_chart", lambda chart, **_: specs.append(chart.to_dict()))
    draw()
    return specs


def test_a_chart_of_more_series_than_colours_is_refused_with_the_fix(monkeypatch):
    table = pa.table({"x": list(range(MAX_SERIES + 1)), "y": [1.0] * (MAX_SERIES + 1), "v": list(range(8))})
    with pytest.raises(
        ValueError, match=r"8 values of v in one chart; at most 7 .*selector.*small multiples"
    ):
        drawn(monkeypatch, lambda: charts.line(table, "x", "y", "t", color="v"))


def test_a_series_keeps_its_colour_when_another_is_absent(monkeypatch):
    table = pa.table({"x": [1, 2], "n": [3, 4], "origin": ["system", "system"]})
    (spec,) = drawn(
        monkeypatch,
        lambda: charts.bars(table, "x", "n", "t", color="origin", domain=["ok", "model", "system"]),
    )
    scale = spec["encoding"]["color"]["scale"]
    assert scale == {
        "domain": ["system"],
        "range": [PALETTE[2]],
    }  # system's colour, and no legend entry for ok


def test_the_mismatch_is_drawn_on_a_log_axis_with_its_threshold(monkeypatch):
    table = pa.table({"step": [0, 1, 2], "mismatch": [0.0, 1.2e-7, 3e-7]})
    (spec,) = drawn(monkeypatch, lambda: charts.line(table, "step", "mismatch", "Mismatch"))
    points, rule = spec["layer"]
    assert points["encoding"]["y"]["scale"] == {"type": "log"}
    assert rule["encoding"]["y"] == {"datum": MISMATCH_THRESHOLD}
    ticks = points["encoding"]["y"]["axis"]["values"]
    assert ticks[0] <= LOG_FLOOR and ticks[-1] >= MISMATCH_THRESHOLD  # whole decades, 0 to the threshold
    data = next(iter(spec["datasets"].values()))
    assert [row["mismatch"] for row in data] == [LOG_FLOOR, 1.2e-7, 3e-7]  # 0 has no log: drawn at the floor


def test_legends_sit_under_the_plot_in_columns_that_fit_and_titles_wrap(monkeypatch):
    table = pa.table({"v": [0], "a_rather_long_measure_name": [0.1], "b": [0.2]})
    title = "A title much longer than a half-width chart holds at a thousand pixels"
    (spec,) = drawn(monkeypatch, lambda: charts.line(table, "v", ["a_rather_long_measure_name", "b"], title))
    legend = spec["encoding"]["color"]["legend"]
    assert (legend["orient"], legend["labelLimit"], legend["columns"]) == ("bottom", 0, 1)
    lines = spec["title"]["text"]
    assert " ".join(lines) == title and max(map(len, lines)) <= TITLE_CHARS


def test_rare_values_fold_into_other_to_stay_within_the_palette():
    kinds = [f"error-{i}" for i in range(10)]
    table = pa.table({"error_type": kinds, "n_calls": list(range(10, 0, -1))})
    folded = charts.fold_rare(table, "error_type", "n_calls").column("error_type").to_pylist()
    assert folded == kinds[: MAX_SERIES - 1] + ["other"] * (10 - MAX_SERIES + 1)


# -- every chart of every page, rendered by the app -------------------------------------------


def specs_of(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]


def views(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The single views of a spec (its layers, concatenations and facets flattened)."""
    inner = [spec.get("spec"), *spec.get("layer", []), *spec.get("concat", []), *spec.get("vconcat", [])]
    nested = [v for part in inner if part for v in views(part)]
    return nested or [spec]


def colours(spec: dict[str, Any]) -> list[tuple[list, list]]:
    """(domain, range) of each field colour of a spec; a fixed colour as ([], [colour])."""
    out = []
    for view in views(spec):
        color = view.get("encoding", {}).get("color")
        if color and "field" in color:
            scale = color.get("scale", {})
            out.append((scale.get("domain", []), scale.get("range", [])))
        elif color and "value" in color:
            out.append(([], [color["value"]]))
    return out


def mismatch_axes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The y encodings of the views of a spec that draw the logprob mismatch."""
    out = []
    for view in views(spec):
        y = view.get("encoding", {}).get("y", {})
        folded = [m for t in view.get("transform", []) for m in t.get("fold", [])]
        if y.get("field") == "mismatch" or (y.get("field") == "value" and "mismatch" in folded):
            out.append(y)
    return out


@pytest.mark.integration  # renders the whole Streamlit app (AppTest)
@pytest.mark.parametrize("page", list(PAGES), ids=list(PAGES))
def test_every_chart_of_every_page_uses_the_palette_few_series_and_a_log_mismatch_axis(
    many_versions_lake, monkeypatch, page
):
    monkeypatch.setenv("TRAJLAKE_LAKE", many_versions_lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = page
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    specs = specs_of(at)
    for spec in specs:
        for domain, colour_range in colours(spec):
            assert colour_range and set(colour_range) <= set(PALETTE), (page, spec.get("title"))
            assert len(domain) <= MAX_SERIES, (page, spec.get("title"), len(domain))
            assert len(set(colour_range)) == len(colour_range)  # one hue per series
        for view in views(spec):
            legend = (view.get("encoding", {}).get("color") or {}).get("legend")
            if legend:
                assert legend["orient"] == "bottom" and legend["labelLimit"] == 0
    if page == "latency":  # MANY_VERSIONS versions: a few are picked to draw, the rest offered
        picker = at.multiselect(key=f"latency_versions:{RUN_ID}:None:latency_s")
        assert len(picker.options) == MANY_VERSIONS and 0 < len(picker.value) <= MAX_SERIES
    mismatch = [y for spec in specs for y in mismatch_axes(spec)]
    if page == "async":  # the Health page's, in tests/dashboards/test_health.py (it needs more steps)
        assert mismatch, f"page {page} draws no mismatch chart"
    assert all(y["scale"]["type"] == "log" for y in mismatch), page
