"""Run overview: reward and pass@1 by policy version, and pass@k for k = 1..16."""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards.views.common import PageContext, empty_state, fmt, frame, line


def render(ctx: PageContext) -> None:
    st.header("Run overview")
    by_version = ctx.metric("overview_by_version", ctx.run_id, ctx.versions, ctx.success_threshold)
    curve = ctx.metric("pass_at_k_curve", ctx.run_id, ctx.versions, ctx.success_threshold)
    if not by_version.num_rows:
        empty_state("trajectories for this run", "Record rollouts with the Recorder or `trajlake loadgen`.")
        return
    by_k = {r["k"]: r["pass_at_k"] for r in curve.to_pylist()}
    rows = by_version.to_pylist()
    n_traj = sum(r["n_trajectories"] for r in rows)
    n_scored = sum(r["n_scored"] for r in rows)
    cols = st.columns(5)
    cols[0].metric("Trajectories", f"{n_traj:,}")
    cols[1].metric("Scored", f"{n_scored:,}", help="finished, with a reward, and not a system failure")
    cols[2].metric("Mean reward (latest version)", fmt(rows[-1]["reward_mean"]))
    cols[3].metric("pass@1", fmt(by_k.get(1)))
    top_k = max(by_k) if by_k else None
    cols[4].metric(f"pass@{top_k or 16}", fmt(by_k.get(top_k)) if top_k else "–")

    left, right = st.columns(2)
    with left:
        line(
            by_version,
            "policy_version",
            ["reward_mean", "pass_at_1"],
            "Reward and pass@1 by policy version",
            x_type="O",
        )
    with right:
        if curve.num_rows:
            line(curve, "k", "pass_at_k", "pass@k (unbiased estimator, averaged over tasks)", x_type="O")
            st.caption(
                "A task counts toward pass@k when it has at least k scored samples (n_tasks in the tooltip)."
            )
        else:
            empty_state("scored trajectories", "pass@k needs finished trajectories with a reward.")
    st.subheader("By policy version")
    st.dataframe(frame(by_version), hide_index=True, key="overview_table")
