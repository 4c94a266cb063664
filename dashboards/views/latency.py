"""Latency & lengths: per-request generation latency and token lengths by policy version, slowest trajectories."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
import pyarrow.compute as pc
import streamlit as st

from trajlake.dashboards.latency import MEASURES
from trajlake.dashboards.views.charts import MAX_SERIES, line
from trajlake.dashboards.views.common import PageContext, empty_state, fmt, frame, tiles

NO_LATENCY = (
    "This run's turns carry no `latency_s`. Pass it to `TrajectoryRecorder.turn(..., latency_s=...)`: "
    "the TITO client's `Completion.record` and `trajlake loadgen` do. Token lengths are shown below."
)


def browser_link(run_id: str, trajectory_id: str) -> str:
    """The trajectory browser opened on one trajectory (a relative URL of this app)."""
    return "?" + urlencode({"page": "browser", "run": run_id, "trajectory": trajectory_id})


def of_measure(table: pa.Table, measure: str) -> pa.Table:
    """The rows of one measure of `length_percentiles`."""
    return table.filter(pc.equal(table.column("measure"), measure))


def render(ctx: PageContext) -> None:
    st.header("Latency & lengths")
    figures = ctx.metric("length_percentiles", ctx.run_id, ctx.versions)
    if not figures.num_rows:
        empty_state("turns for this run", "Record rollouts with the Recorder or `trajlake loadgen`.")
        return
    by_measure = {name: of_measure(figures, name) for name in MEASURES}
    latest = {name: (t.to_pylist()[-1] if t.num_rows else None) for name, t in by_measure.items()}
    version = max(r["policy_version"] for r in latest.values() if r)
    cols = tiles(5)
    cols[0].metric("Latency p50", _figure(latest["latency_s"], "p50", " s", 2))
    cols[1].metric("Latency p99", _figure(latest["latency_s"], "p99", " s", 2))
    cols[2].metric("Output tokens / turn p50", _figure(latest["output_tokens"], "p50", "", 0))
    cols[3].metric("Tokens / trajectory p50", _figure(latest["tokens"], "p50", "", 0))
    cols[4].metric("Turns / trajectory p50", _figure(latest["turns"], "p50", "", 1))
    n_timed, n_turns = (sum(by_measure[m].column("n").to_pylist()) for m in ("latency_s", "output_tokens"))
    st.caption(
        f"Latest policy version {version} in the selection. {n_timed:,} of {n_turns:,} turns carry a "
        "generation latency; per-trajectory figures count finished trajectories."
    )
    if not n_timed:
        empty_state("generation latencies", NO_LATENCY)

    left, right = st.columns(2)
    for i, (name, measure) in enumerate(MEASURES.items()):
        if not by_measure[name].num_rows:
            continue
        with left if i % 2 == 0 else right:
            line(
                by_measure[name],
                "policy_version",
                ["p50", "p90", "p99"],
                f"{measure.title}: p50 / p90 / p99",
                x_type="O",
                y_title=measure.unit,
            )
    render_distribution(ctx, [name for name in MEASURES if by_measure[name].num_rows])
    render_slowest(ctx, n_timed)
    st.subheader("By policy version")
    st.dataframe(frame(figures), hide_index=True, key="latency_table")


def render_distribution(ctx: PageContext, names: list[str]) -> None:
    """One measure's distribution for a few policy versions the user picks (all of them: a line each, unreadable)."""
    st.subheader("Distributions")
    name = st.radio(
        "Distribution of",
        names,
        horizontal=True,
        key="latency_measure",
        format_func=lambda n: MEASURES[n].title,
    )
    hist = ctx.metric("length_histogram", ctx.run_id, name, ctx.versions)
    versions = sorted(set(hist.column("policy_version").to_pylist()))
    chosen = st.multiselect(
        "Policy versions to compare",
        versions,
        default=spread(versions, DEFAULT_VERSIONS),
        max_selections=MAX_SERIES,
        key=f"latency_versions:{ctx.run_id}:{ctx.versions}:{name}",
        help=f"up to {MAX_SERIES}; by default the first, the latest and some between",
    )
    if not chosen:
        st.info("Pick one or more policy versions to draw their distributions.", icon=":material/tune:")
        return
    picked = sorted(chosen)
    shown = hist.filter(
        pc.is_in(hist.column("policy_version"), pa.array(picked, hist.schema.field("policy_version").type))
    )
    title = f"{MEASURES[name].title}, by policy version"
    line(shown, "bin_start", "share", title, color="policy_version", domain=picked, wide=True)
    st.caption("Share of each version's values per bin; the last bin holds the top 1 % of the selection.")


DEFAULT_VERSIONS = 4
"""Versions the distribution chart opens with: the first, the latest, and evenly spaced ones between."""


def spread(values: list[Any], n: int) -> list[Any]:
    """Up to `n` of `values`, evenly spaced, the first and the last included."""
    if len(values) <= n:
        return list(values)
    return list(dict.fromkeys(values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)))


def render_slowest(ctx: PageContext, n_timed: int) -> None:
    if not n_timed:
        return
    st.subheader("Slowest trajectories")
    slowest = frame(ctx.metric("slowest_trajectories", ctx.run_id, ctx.versions))
    slowest.insert(0, "open", [browser_link(ctx.run_id, t) for t in slowest["trajectory_id"]])
    st.caption(
        "By time spent generating (the sum of their turns' latency); open one in the trajectory browser."
    )
    st.dataframe(
        slowest,
        hide_index=True,
        key="latency_slowest",
        column_config={
            "open": st.column_config.LinkColumn("open", display_text=":material/open_in_new:"),
            "generation_s": st.column_config.NumberColumn(format="%.2f"),
            "slowest_turn_s": st.column_config.NumberColumn(format="%.2f"),
        },
    )


def _figure(row: dict[str, Any] | None, key: str, unit: str, digits: int) -> str:
    return "–" if row is None else f"{fmt(row[key], digits)}{unit}"
