"""Every chart of the app: one palette, legends that fit, titles that wrap, a log axis for mismatch.

What makes a chart readable is decided here once, for every page: series get distinct hues from
`PALETTE` (never shades of one hue); a chart refuses more than MAX_SERIES series, so a page offers
a selector or small multiples instead; legends sit under the plot in as many columns as fit a
half-width chart; titles wrap rather than being cut; a measure in LOG_MEASURES (the logprob
mismatch, whose healthy values sit 4-6 decades under its threshold) is drawn on a log axis with
its threshold. Charts render as SVG, so their text can be checked in a browser.
"""

from __future__ import annotations

import html
import math
import textwrap
from collections.abc import Sequence
from typing import Any

import altair as alt
import pyarrow as pa
import streamlit as st

from trajlake.dashboards.metrics import MISMATCH_THRESHOLD
from trajlake.dashboards.views.common import frame

PALETTE = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2")
"""Seven hues of Tableau 10 (Vega's `tableau10`): blue, orange, red, teal, green, yellow, purple."""
MAX_SERIES = len(PALETTE)
"""The most series one chart draws; more need a selector or small multiples."""
RULE_COLOR = "#444444"
"""Reference lines (a threshold), dashed, in no series' colour."""
TITLE_CHARS = 28
"""Characters per title line: what a half-width chart holds at 1000 px (about 8.5 px a character)."""
LEGEND_PX = 140
"""The width a legend may take: it starts at the plot's left edge, which a bar chart's names push right."""
LOG_MEASURES = {"mismatch": MISMATCH_THRESHOLD}
"""Measures drawn on a log axis, with the threshold each is judged against."""
LOG_FLOOR = 1e-9
"""Where a log axis draws a 0 (a float32 engine's mismatch sits near 1e-7)."""
EDGE_PX = 6
"""Padding inside a chart's box, so that a label flush with the plot's end is not cut by the box."""
CHART_HEIGHT = 350
"""Pixels a chart takes with a one-line title and no legend, axes included (Streamlit's default)."""
SMALL_HEIGHT = 240
"""Pixels a small multiple takes, title and axes included."""
TITLE_LINE_PX = 20
"""Pixels each further line of a wrapped title adds."""
LEGEND_ROW_PX = 22
"""Pixels each row of a legend under the plot adds."""


def title_lines(title: str, wide: bool = False) -> list[str]:
    """The title in lines that fit a half-width chart (a full-width one: twice as long)."""
    return textwrap.wrap(title, TITLE_CHARS * (2 if wide else 1)) or [""]


def legend_columns(entries: Sequence[Any]) -> int:
    """How many legend entries fit side by side in LEGEND_PX."""
    per_entry = 34 + 7 * max(len(str(v)) for v in entries)  # symbol, padding, ~7 px a label character
    return max(1, min(len(entries), LEGEND_PX // per_entry))


def legend(entries: Sequence[Any]) -> alt.Legend:
    """A legend under the plot: as many columns as fit LEGEND_PX, labels never cut."""
    return alt.Legend(
        orient="bottom", columns=legend_columns(entries), labelLimit=0, title=None, symbolOpacity=1
    )


def present(domain: Sequence[Any], values: Sequence[Any] | None) -> list[Any]:
    """The values of `domain` (at most its first MAX_SERIES) that are among `values` (None: all), in domain order."""
    here = set(domain if values is None else values)
    return [v for v in domain[:MAX_SERIES] if v in here]


def series_color(
    field: str, domain: Sequence[Any], values: Sequence[Any] | None = None, show_legend: bool = True
) -> alt.Color:
    """Colour by `field`: the i-th value of `domain` gets the i-th PALETTE hue, on every chart that
    passes the same domain; those not among the data's `values` are left out of the legend."""
    if len(domain) > MAX_SERIES:
        raise ValueError(
            f"{len(domain)} values of {field} in one chart; at most {MAX_SERIES} stay readable: "
            "let the user pick some (a selector) or draw small multiples"
        )
    hue = dict(zip(domain, PALETTE, strict=False))
    shown = present(domain, values)
    scale = alt.Scale(domain=shown, range=[hue[v] for v in shown])
    return alt.Color(f"{field}:N", scale=scale, legend=legend(shown) if show_legend and shown else None)


def values_of(data: Any, field: str) -> list[Any]:
    """The distinct values of a column, in the order they first appear."""
    return list(dict.fromkeys(data[field].tolist()))


def show(
    chart: Any, title: str, wide: bool = False, legend_entries: Sequence[Any] = (), height: int = CHART_HEIGHT
) -> None:
    """Draw a chart (SVG) at the container's width: its title wrapped to fit, as tall as its plot needs
    beside the title's lines and the legend's rows, with room at its edges for axis labels set flush."""
    lines = title_lines(title, wide)
    rows = -(-len(legend_entries) // legend_columns(legend_entries)) if legend_entries else 0
    chart = chart.properties(
        title=alt.TitleParams(lines),
        height=height + TITLE_LINE_PX * (len(lines) - 1) + LEGEND_ROW_PX * rows,
        padding={side: EDGE_PX for side in ("left", "right", "top", "bottom")},
        usermeta={"embedOptions": {"renderer": "svg"}},
    )
    st.altair_chart(chart, width="stretch")


def y_encoding(data: Any, field: str, title: str, measures: Sequence[str]) -> tuple[alt.Y, float | None]:
    """The y encoding of `measures` and the threshold to draw: for measures in LOG_MEASURES a log axis
    ticked at whole decades from the data to the threshold (0 drawn at LOG_FLOOR, clipped in `data`)."""
    rule = LOG_MEASURES.get(measures[0])
    if rule is None or any(LOG_MEASURES.get(m) != rule for m in measures):
        return alt.Y(f"{field}:Q", title=title), None
    for m in measures:
        data[m] = data[m].clip(lower=LOG_FLOOR)
    values = [v for m in measures for v in data[m].dropna().tolist()] + [rule]
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    step = max(1, math.ceil((high - low) / 8))
    axis = alt.Axis(
        format="~e",
        values=[10.0**e for e in range(low, high + 1, step)],
        title=f"{title} (log scale)".strip(),
    )
    return alt.Y(f"{field}:Q", scale=alt.Scale(type="log"), axis=axis), rule


def line(
    table: pa.Table,
    x: str,
    y: str | list[str],
    title: str,
    *,
    color: str | None = None,
    x_type: str = "Q",
    rule: float | None = None,
    y_title: str | None = None,
    x_title: str | None = None,
    domain: list[Any] | None = None,
    wide: bool = False,
    show_legend: bool = True,
    height: int = CHART_HEIGHT,
) -> None:
    """A line chart of one or more measures (several `y` are folded into a `measure` colour).

    `domain` fixes the order of the `color` values, so each keeps its colour across charts."""
    data = frame(table)
    measures = y if isinstance(y, list) else [y]
    field = "value" if isinstance(y, list) else y
    y_enc, log_rule = y_encoding(
        data, field, y_title if y_title is not None else ("" if isinstance(y, list) else y), measures
    )
    rule = rule if rule is not None else log_rule
    chart = alt.Chart(data)
    color_enc: Any
    entries: list[Any] = []
    if isinstance(y, list):
        chart = chart.transform_fold(list[Any](y), as_=["measure", "value"])
        drawn = [m for m in y if data[m].notna().any()]  # a measure hidden everywhere has no legend entry
        color_enc, entries = series_color("measure", y, drawn, show_legend), present(y, drawn)
    elif color:
        series = domain or values_of(data, color)
        color_enc = series_color(color, series, values_of(data, color), show_legend)
        entries = present(series, values_of(data, color))
    else:
        color_enc = alt.value(PALETTE[0])
    layer = chart.mark_line(point=True).encode(
        x=alt.X(f"{x}:{x_type}", title=x_title or x, axis=alt.Axis(labelAngle=0)),
        y=y_enc,
        color=color_enc,
        tooltip=list(data.columns),
    )
    if rule is not None:
        layer += alt.Chart(data).mark_rule(color=RULE_COLOR, strokeDash=[4, 4]).encode(y=alt.datum(rule))
    show(layer, title, wide, entries if show_legend else [], height)


def bars(
    table: pa.Table,
    x: str,
    y: str,
    title: str,
    *,
    color: str | None = None,
    x_type: str = "N",
    horizontal: bool = False,
    stack: bool = True,
    domain: list[Any] | None = None,
    wide: bool = False,
) -> None:
    """A bar chart, stacked by `color` when given."""
    data = frame(table)
    x_enc = alt.X(f"{x}:{x_type}", title=x, sort=None, axis=alt.Axis(labelAngle=0))
    y_enc = alt.Y(f"{y}:Q", title=y, stack=stack or None)
    enc: dict[str, Any] = {"x": y_enc, "y": x_enc} if horizontal else {"x": x_enc, "y": y_enc}
    entries: list[Any] = []
    enc["color"] = alt.value(PALETTE[0])
    if color:
        series, values = domain or values_of(data, color), values_of(data, color)
        enc["color"], entries = series_color(color, series, values), present(series, values)
    show(alt.Chart(data).mark_bar().encode(**enc, tooltip=list(data.columns)), title, wide, entries)


def area(
    table: pa.Table,
    x: str,
    y: str,
    color: str,
    title: str,
    *,
    normalize: bool = False,
    domain: list[str] | None = None,
    wide: bool = False,
) -> None:
    """Stacked bars per time bucket (shares when `normalize`), readable even with a single bucket."""
    data = frame(table)
    times = data[x]
    span_days = (times.max() - times.min()).days if len(times) else 0
    data["time"] = times.dt.strftime("%m-%d %H:%M:%S" if span_days else "%H:%M:%S")
    chart = (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X("time:O", title=f"{x} (UTC)", axis=time_axis(len(data) > 12)),
            y=alt.Y(f"{y}:Q", stack="normalize" if normalize else True, title="share" if normalize else y),
            color=series_color(color, domain or values_of(data, color), values_of(data, color)),
            tooltip=[c for c in data.columns if c != x],
        )
    )
    show(chart, title, wide, present(domain or values_of(data, color), values_of(data, color)))


def time_axis(slanted: bool) -> alt.Axis:
    """The axis of time buckets: slanted labels ending at their tick (never past the chart's right edge)."""
    return alt.Axis(labelAngle=-45, labelAlign="right") if slanted else alt.Axis(labelAngle=0)


def small_multiples(
    table: pa.Table,
    x: str,
    measures: dict[str, str],
    x_type: str,
    runs: list[str],
    empty: dict[str, str] | None = None,
    columns: int = 2,
) -> None:
    """One small chart per measure (its own y axis; a log one for mismatch), a line per run in each,
    under one legend of the runs' colours. A measure without a value says so (`empty[measure]`: why)."""
    st.html(legend_html(runs))
    cells = st.columns(columns)
    for i, (measure, title) in enumerate(measures.items()):
        with cells[i % columns]:
            if table.column(measure).null_count == table.num_rows:
                st.markdown(f"**{title}**")
                st.caption((empty or {}).get(measure, "No value recorded for these runs."))
                continue
            line(
                table.select(["run_id", x, measure]), x, measure, title, color="run_id", x_type=x_type,
                y_title="", domain=runs, show_legend=False, height=SMALL_HEIGHT,
            )  # fmt: skip


def legend_html(domain: Sequence[Any]) -> str:
    """A legend as HTML (it wraps at any width): a PALETTE dot and the name of each value."""
    if len(domain) > MAX_SERIES:
        raise ValueError(f"{len(domain)} series in one legend; at most {MAX_SERIES}: offer a selector")
    dot = "display:inline-block;width:0.75em;height:0.75em;border-radius:50%;margin-right:0.35em"
    items = "".join(
        f'<span style="white-space:nowrap;margin-right:1.4em"><span style="{dot};background:{c}"></span>'
        f"{html.escape(str(v))}</span>"
        for v, c in zip(domain, PALETTE, strict=False)
    )
    return f'<div class="series-legend" style="line-height:1.9;font-size:0.875rem">{items}</div>'


COVERAGE = "tasks with ≥ k samples"
"""The bars under a pass@k line: how much of the run each k stands on."""


def pass_at_k_chart(curve: pa.Table, title: str, runs: list[str] | None = None, wide: bool = False) -> None:
    """pass@k per k as a line (a hidden value leaves a gap) over bars of the share of tasks each k
    covers, both on one 0-1 axis; with `runs`, a line and a bar per run in the run's colour."""
    data = frame(curve)
    data["coverage"] = data["n_tasks"] / data["n_tasks_total"]
    tooltip = [*(["run_id"] if runs else []), "k", "pass_at_k", "n_tasks", "n_tasks_total"]
    x = alt.X("k:O", title="k", axis=alt.Axis(labelAngle=0))
    y = alt.Y("pass_at_k:Q", title="share", scale=alt.Scale(domain=[0, 1]))
    cover = alt.Y("coverage:Q", scale=alt.Scale(domain=[0, 1]))
    base = alt.Chart(data)
    if runs:
        color = series_color("run_id", runs)
        covered = base.mark_bar(opacity=0.3).encode(
            x=x, xOffset="run_id:N", y=cover, color=color, tooltip=tooltip
        )
        lines = base.mark_line(point=True).encode(x=x, y=y, color=color, tooltip=tooltip)
    else:  # one colour scale over two fields, one per layer: a legend entry for the line and the bars
        data["bars"], data["line"] = COVERAGE, "pass@k"
        covered = base.mark_bar(opacity=0.45).encode(
            x=x, y=cover, color=series_color("bars", ["pass@k", COVERAGE]), tooltip=tooltip
        )
        lines = base.mark_line(point=True).encode(
            x=x, y=y, color=series_color("line", ["pass@k", COVERAGE]), tooltip=tooltip
        )
    show(covered + lines, title, wide, runs or ["pass@k", COVERAGE])


def fold_rare(table: pa.Table, column: str, weight: str) -> pa.Table:
    """`table` with the values of `column` beyond the MAX_SERIES - 1 heaviest (by `weight`) renamed
    `other`, so a colour per value stays within MAX_SERIES."""
    totals: dict[Any, float] = {}
    for value, w in zip(table.column(column).to_pylist(), table.column(weight).to_pylist(), strict=True):
        totals[value] = totals.get(value, 0) + (w or 0)
    if len(totals) <= MAX_SERIES:
        return table
    keep = set(sorted(totals, key=lambda v: -totals[v])[: MAX_SERIES - 1])
    folded = [v if v in keep else "other" for v in table.column(column).to_pylist()]
    return table.set_column(table.schema.get_field_index(column), column, pa.array(folded, pa.string()))
