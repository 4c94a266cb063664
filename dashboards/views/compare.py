"""Compare runs: several runs overlaid by policy version and by trainer step, one line per run.

The runs are picked on the page and kept in the URL (`?page=compare&runs=a,b`); by default the
sidebar's run and the newest other one. The figures are those of `trajlake metrics --runs`.
"""

from __future__ import annotations

from typing import Any

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

BY_VERSION = [
    ("reward_mean", "Mean reward"),
    ("pass_at_1", "pass@1"),
    ("rollout_entropy", "Rollout entropy (−mean logprob)"),
    ("turns_per_trajectory", "Turns per trajectory"),
    ("tool_success_rate", "Tool success rate"),
    ("system_failure_rate", "System failure rate"),
    ("model_failure_rate", "Model failure rate"),
]
BY_STEP = [
    ("reward_mean", "Mean reward of the consumed trajectories"),
    ("pass_at_1", "pass@1 of the consumed trajectories"),
    ("entropy", "Trainer entropy"),
    ("mismatch", f"Train/inference logprob mismatch (healthy < {MISMATCH_THRESHOLD})"),
    ("staleness_mean", "Mean staleness at consumption"),
    ("turns_per_trajectory", "Turns per consumed trajectory"),
    ("tool_success_rate", "Tool success rate of the consumed trajectories"),
    ("system_failure_rate", "System failure rate of the consumed trajectories"),
    ("model_failure_rate", "Model failure rate of the consumed trajectories"),
]
"""The charts of each section: (column, title); each draws one line per run."""
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


def overlay(table: Any, x: str, charts: list[tuple[str, str]], x_type: str, run_ids: list[str]) -> list:
    """A grid of line charts, one per (column, title), each with a line per run; returns the grid."""
    grid = st.columns(COLUMNS)
    for i, (column, title) in enumerate(charts):
        with grid[i % COLUMNS]:
            rule = MISMATCH_THRESHOLD if column == "mismatch" else None
            line(table, x, column, title, color="run_id", x_type=x_type, rule=rule, domain=run_ids)
    return grid


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
    grid = overlay(versions, "policy_version", BY_VERSION, "O", list(run_ids))
    with grid[len(BY_VERSION) % COLUMNS]:
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
    overlay(steps, "step", BY_STEP, "Q", list(run_ids))
    with st.expander("Figures by trainer step"):
        st.dataframe(frame(steps), hide_index=True, key="compare_steps")
