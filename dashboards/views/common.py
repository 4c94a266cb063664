"""What every page shares: the page context, cached metric queries, charts and empty states."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import altair as alt
import pyarrow as pa
import streamlit as st

from trajlake.dashboards import metrics

CACHE_TTL_S = 600
"""How long a query's result stays in memory. Results are keyed on the lake's Delta versions
(`lake_state`), so a new commit is read on the next rerun whatever this is."""


@st.cache_resource(show_spinner=False)
def open_lake(root: str) -> Any:
    """One `Lake` per root for the whole app (its DuckDB engine follows new Delta versions)."""
    from trajlake.store.lake import Lake

    if "://" not in root and not os.path.isdir(root):
        raise FileNotFoundError(
            f"no lake at {root}; pass --lake (or set TRAJLAKE_LAKE) to a lake made by `trajlake loadgen` or `trajlake demo`"
        )
    return Lake(root)


def lake_state(root: str) -> tuple[int, ...]:
    """The current Delta version of every table (a log poll each, about a millisecond locally)."""
    from trajlake.store.lake import TABLES

    lake = open_lake(root)
    return tuple(lake.version(name) for name in TABLES)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def _cached_metric(root: str, state: tuple[int, ...], name: str, args: tuple, kwargs: tuple) -> Any:
    return getattr(metrics, name)(open_lake(root), *args, **dict(kwargs))


def read_metric(root: str, state: tuple[int, ...], name: str, *args: Any, **kwargs: Any) -> Any:
    """`metrics.<name>(lake, *args, **kwargs)`, cached for the lake's tables at versions `state`."""
    return _cached_metric(root, state, name, args, tuple(sorted(kwargs.items())))


@dataclass(frozen=True)
class PageContext:
    """The selections a page renders for: lake root, run, version range, pass threshold."""

    lake_root: str
    run_id: str
    versions: tuple[int, int] | None
    success_threshold: float
    tokenizer_path: str | None = None
    lake_state: tuple[int, ...] = ()
    """The Delta versions the page reads at (see `lake_state`); a new commit makes new cache keys."""

    @property
    def lake(self) -> Any:
        return open_lake(self.lake_root)

    def metric(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """`metrics.<name>(lake, *args, **kwargs)`, computed once per lake state."""
        return read_metric(self.lake_root, self.lake_state, name, *args, **kwargs)


def frame(table: pa.Table) -> Any:
    """A pandas frame for Altair and st.dataframe."""
    return table.to_pandas()


def empty_state(what: str, how: str) -> None:
    """A friendly note where a chart has no data yet."""
    st.info(f"**No {what} yet.** {how}", icon=":material/hourglass_empty:")


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
    domain: list[str] | None = None,
) -> None:
    """A line chart of one or more measures (several `y` are folded into a `measure` colour).

    `domain` fixes the order of the `color` values, so each keeps its colour across charts.
    """
    data = frame(table)
    chart = alt.Chart(data)
    color_enc: Any
    if isinstance(y, list):
        chart = chart.transform_fold(list[Any](y), as_=["measure", "value"])
        y_enc, color_enc = alt.Y("value:Q", title=y_title or ""), alt.Color("measure:N", title=None)
    else:
        y_enc = alt.Y(f"{y}:Q", title=y_title or y)
        scale = alt.Scale(domain=domain) if domain else alt.Undefined
        color_enc = alt.Color(f"{color}:N", scale=scale) if color else alt.value("#4c78a8")
    layer = chart.mark_line(point=True).encode(
        x=alt.X(f"{x}:{x_type}", title=x, axis=alt.Axis(labelAngle=0)),
        y=y_enc,
        color=color_enc,
        tooltip=list(data.columns),
    )
    if rule is not None:
        layer = layer + alt.Chart(data).mark_rule(color="red", strokeDash=[4, 4]).encode(y=alt.datum(rule))
    st.altair_chart(layer.properties(title=title), width="stretch")


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
    domain: list[str] | None = None,
) -> None:
    """A bar chart, stacked by `color` when given."""
    data = frame(table)
    x_enc = alt.X(f"{x}:{x_type}", title=x, sort=None, axis=alt.Axis(labelAngle=0))
    y_enc = alt.Y(f"{y}:Q", title=y, stack=stack or None)
    enc: dict[str, Any] = {"x": y_enc, "y": x_enc} if horizontal else {"x": x_enc, "y": y_enc}
    if color:
        enc["color"] = alt.Color(f"{color}:N", scale=alt.Scale(domain=domain) if domain else alt.Undefined)
    chart = alt.Chart(data, title=title).mark_bar().encode(**enc, tooltip=list(data.columns))
    st.altair_chart(chart, width="stretch")


def area(
    table: pa.Table,
    x: str,
    y: str,
    color: str,
    title: str,
    *,
    normalize: bool = False,
    domain: list[str] | None = None,
) -> None:
    """Stacked bars per time bucket (shares when `normalize`), readable even with a single bucket."""
    data = frame(table)
    times = data[x]
    span_days = (times.max() - times.min()).days if len(times) else 0
    data["time"] = times.dt.strftime("%m-%d %H:%M:%S" if span_days else "%H:%M:%S")
    chart = (
        alt.Chart(data, title=title)
        .mark_bar()
        .encode(
            x=alt.X("time:O", title=f"{x} (UTC)", axis=alt.Axis(labelAngle=-45 if len(data) > 12 else 0)),
            y=alt.Y(f"{y}:Q", stack="normalize" if normalize else True, title="share" if normalize else y),
            color=alt.Color(f"{color}:N", scale=alt.Scale(domain=domain) if domain else alt.Undefined),
            tooltip=[c for c in data.columns if c != x],
        )
    )
    st.altair_chart(chart, width="stretch")


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure as shown in st.metric ('–' when there is none)."""
    return "–" if value is None else f"{value:.{digits}f}"
