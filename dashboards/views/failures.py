"""Failures: system vs model over time, by label, environment and tool; the labels people put on
trajectories, by outcome; dead letters."""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards.views.charts import area, bars, fold_rare
from trajlake.dashboards.views.common import PageContext, empty_state, frame, tiles

ORIGINS = ["ok", "model", "system"]
"""Outcomes in colour order: every chart of the page gives each the same colour."""


def render(ctx: PageContext) -> None:
    st.header("Failures")
    over_time = ctx.metric("failures_over_time", ctx.run_id, ctx.versions)
    if not over_time.num_rows:
        empty_state("finished trajectories", "Failures are counted when trajectories finish.")
    else:
        totals: dict[str, int] = {}
        for r in over_time.to_pylist():
            totals[r["origin"]] = totals.get(r["origin"], 0) + r["n_trajectories"]
        n = sum(totals.values())
        cols = tiles(3)
        cols[0].metric(
            "System failures",
            f"{totals.get('system', 0):,}",
            f"{totals.get('system', 0) / n:.1%} of finished",
            delta_color="off",
            delta_arrow="off",
        )
        cols[1].metric(
            "Model failures",
            f"{totals.get('model', 0):,}",
            f"{totals.get('model', 0) / n:.1%} of finished",
            delta_color="off",
            delta_arrow="off",
        )
        cols[2].metric("Finished", f"{n:,}")
        area(
            over_time,
            "bucket_start",
            "n_trajectories",
            "origin",
            "Outcomes over time (system vs model failure)",
            domain=ORIGINS,
            wide=True,
        )
    left, right = st.columns(2)
    with left:
        by_label = ctx.metric("failures_by", ctx.run_id, "label", ctx.versions)
        if by_label.num_rows:
            bars(
                by_label,
                "label",
                "n_trajectories",
                "Failures by label",
                color="origin",
                horizontal=True,
                domain=ORIGINS,
            )
        else:
            empty_state("failures", "No trajectory of the selection failed.")
    with right:
        by_env = ctx.metric("failures_by", ctx.run_id, "environment", ctx.versions)
        if by_env.num_rows:
            bars(
                by_env,
                "environment",
                "n_trajectories",
                "Failures by environment",
                color="origin",
                horizontal=True,
                domain=ORIGINS,
            )
    tools = ctx.metric("tool_failures", ctx.run_id, ctx.versions)
    if tools.num_rows:
        bars(
            fold_rare(tools, "error_type", "n_calls"),
            "tool_name",
            "n_calls",
            "Failed tool calls by tool and error type",
            color="error_type",
            horizontal=True,
            wide=True,
        )
    st.subheader("Labels")
    labels = ctx.metric("labels_by_outcome", ctx.run_id)
    if labels.num_rows:
        bars(labels, "label", "n_trajectories", "Labelled trajectories by label and outcome", color="origin",
             horizontal=True, domain=ORIGINS, wide=True)  # fmt: skip
    else:
        st.info(
            "No labels on this run. Label a trajectory in the Trajectory browser or with `trajlake label`; "
            "the sampler can leave labelled ones out (`exclude_labels`).",
            icon=":material/label:",
        )
    st.subheader("Dead letters")
    reasons = ctx.metric("dead_letter_reasons", ctx.run_id)
    if reasons.num_rows:
        st.metric("Dead letters", f"{sum(reasons.column('n_dead_letters').to_pylist()):,}")
        st.dataframe(frame(reasons), hide_index=True, key="dead_letter_reasons")
        st.dataframe(
            frame(ctx.metric("recent_dead_letters", ctx.run_id)), hide_index=True, key="dead_letters"
        )
    else:
        st.success("No dead letters: every event of this run passed validation.")
