"""Compare runs: several runs overlaid by policy version and by trainer step, one line per run.

The runs are picked on the page and kept in the URL (`?page=compare&runs=a,b`); by default the
sidebar's run and the newest other one. The figures are those of `trajlake metrics --runs`.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import streamlit as st

from trajlake.dashboards import compare
from trajlake.dashboards.metrics import MISMATCH_THRESHOLD
from trajlake.dashboards.views.common import (
    CACHE_TTL_S,
    PageContext,
    empty_state,
    frame,
    line,
    open_lake,
    read_metric,
)

BY_VERSION = {
    "reward_mean": "Mean reward",
    "pass_at_1": "pass@1",
    "rollout_entropy": "Rollout entropy (−mean logprob)",
    "turns_per_trajectory": "Turns per trajectory",
    "tool_success_rate": "Tool success rate",
    "system_failure_rate": "System failure rate",
    "model_failure_rate": "Model failure rate",
}
BY_STEP = {
    "reward_mean": "Mean reward",
    "pass_at_1": "pass@1",
    "entropy": "Trainer entropy",
    "mismatch": f"Logprob mismatch (healthy < {MISMATCH_THRESHOLD})",
    "staleness_mean": "Mean staleness",
    "turns_per_trajectory": "Turns per trajectory",
    "tool_success_rate": "Tool success rate",
    "system_failure_rate": "System failure rate",
    "model_failure_rate": "Model failure rate",
}
"""The small charts of each section: column -> title; each draws one line per run."""
COLUMNS = 3


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def read_comparison(
    root: str, state: tuple[int, ...], name: str, run_ids: tuple[str, ...], success_threshold: float
) -> Any:
    """`compare.<name>(lake, run_ids, success_threshold)`, cached for the lake's tables at versions `state`."""
    return getattr(compare, name)(open_lake(root), list(run_ids), success_threshold)


def choose_runs(runs: list[str], current: str) -> list[str]:
    """The compared runs, kept in sync with `?runs=a,b` (default: `current` and the newest other run)."""
    wanted = [r for r in st.query_params.get("runs", "").split(",") if r]
    unknown = [r for r in wanted if r not in runs]
    if unknown:
        st.warning(f"Not in this lake, left out: {', '.join(unknown)}. Runs here: {', '.join(runs)}.")
    default = [r for r in wanted if r in runs] or [current, *[r for r in runs if r != current][:1]]
    chosen = st.multiselect("Runs", runs, default=default, key="compare_runs", help="newest first")
    if chosen:
        st.query_params["runs"] = ",".join(chosen)
    elif "runs" in st.query_params:
        del st.query_params["runs"]
    return chosen


def small_multiples(table: Any, x: str, measures: dict[str, str], x_type: str, run_ids: list[str]) -> None:
    """One small chart per measure (each with its own y scale), a line per run in each: one Vega-Lite
    facet, so the page builds and validates one chart per section rather than one per measure."""
    data = frame(table.select(["run_id", x, *measures])).rename(columns=measures)
    titles = list(measures.values())
    chart = (
        alt.Chart(data)
        .transform_fold(list[Any](titles), as_=["measure", "value"])
        .mark_line(point=True)
        .encode(
            x=alt.X(f"{x}:{x_type}", title=x, axis=alt.Axis(labelAngle=0)),
            y=alt.Y("value:Q", title=None),
            color=alt.Color("run_id:N", scale=alt.Scale(domain=run_ids), title="run"),
            tooltip=["run_id:N", f"{x}:{x_type}", "measure:N", "value:Q"],
        )
        .properties(width=260, height=170)
        .facet(facet=alt.Facet("measure:N", sort=titles, title=None), columns=COLUMNS)
        .resolve_scale(y="independent")
        .resolve_axis(x="independent")
    )
    st.altair_chart(chart, width="content")


def render(ctx: PageContext) -> None:
    st.header("Compare runs")
    run_ids = tuple(choose_runs(read_metric(ctx.lake_root, ctx.lake_state, "runs"), ctx.run_id))
    if not run_ids:
        st.info("Pick one or more runs to compare.", icon=":material/compare_arrows:")
        return

    def read(name: str) -> Any:
        return read_comparison(ctx.lake_root, ctx.lake_state, name, run_ids, ctx.success_threshold)

    versions, steps, curves = read("by_version"), read("by_step"), read("pass_at_k_curves")
    st.dataframe(frame(compare.summary(versions, steps, curves)), hide_index=True, key="compare_summary")
    st.caption(
        "pass_at_k is at k, the largest k every compared run reaches; mismatch_latest is the last "
        "trainer step's; rates are shares of all trajectories."
    )

    st.subheader("By policy version")
    if versions.num_rows:
        small_multiples(versions, "policy_version", BY_VERSION, "O", list(run_ids))
    else:
        empty_state(
            "policy versions for these runs", "Trajectories carry the policy version that started them."
        )
    with st.columns(COLUMNS)[0]:
        if curves.num_rows:
            title = "pass@k (unbiased estimator)"
            line(curves, "k", "pass_at_k", title, color="run_id", x_type="O", domain=list(run_ids))
        else:
            empty_state("scored trajectories", "pass@k needs finished trajectories with a reward.")
    with st.expander("Figures by policy version"):
        st.dataframe(frame(versions), hide_index=True, key="compare_versions")

    st.subheader("By trainer step")
    if not steps.num_rows:
        empty_state(
            "trainer steps for these runs",
            "The trainer records consumed batches (`batch_consumption`) and its steps (`trainer_steps`).",
        )
        return
    st.caption(
        "Reward, pass@1, staleness, turns, tool success and failures: of the trajectories the trainer "
        "consumed at the step. Entropy and mismatch: what the trainer reported (mean over ranks)."
    )
    small_multiples(steps, "step", BY_STEP, "Q", list(run_ids))
    with st.expander("Figures by trainer step"):
        st.dataframe(frame(steps), hide_index=True, key="compare_steps")
