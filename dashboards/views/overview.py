"""Run overview: reward and pass@1 by policy version, and pass@k for k = 1..16 beside the tasks it covers."""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards.passk import basis, curve_basis
from trajlake.dashboards.views.charts import line, pass_at_k_chart
from trajlake.dashboards.views.common import PageContext, empty_state, fmt, frame, tiles


def render(ctx: PageContext) -> None:
    st.header("Run overview")
    by_version = ctx.metric(
        "overview_by_version", ctx.run_id, ctx.versions, ctx.success_threshold, ctx.min_tasks
    )
    curve = ctx.metric(
        "pass_at_k_curve", ctx.run_id, ctx.versions, ctx.success_threshold, min_tasks=ctx.min_tasks
    )
    if not by_version.num_rows:
        empty_state("trajectories for this run", "Record rollouts with the Recorder or `trajlake loadgen`.")
        return
    rows, points = by_version.to_pylist(), curve.to_pylist()
    shown = [r for r in points if r["pass_at_k"] is not None]
    latest = rows[-1]
    cols = tiles(5)
    cols[0].metric("Trajectories", f"{sum(r['n_trajectories'] for r in rows):,}")
    cols[1].metric(
        "Scored",
        f"{sum(r['n_scored'] for r in rows):,}",
        help="finished, with a reward, and not a system failure",
    )
    cols[2].metric(
        "Latest reward",
        fmt(latest["reward_mean"]),
        help=f"mean reward of policy version {latest['policy_version']}: {latest['n_scored']:,} scored trajectories",
    )
    first = points[0] if points else None
    cols[3].metric("pass@1", fmt(first and first["pass_at_k"]), help=first and basis(first, ctx.min_tasks))
    top = shown[-1] if shown else None
    cols[4].metric(
        f"pass@{top['k']}" if top else "pass@k",
        fmt(top and top["pass_at_k"]),
        help=f"the largest k shown, over {basis(top)}" if top else "no k has enough tasks",
    )

    left, right = st.columns(2)
    with left:
        line(
            by_version,
            "policy_version",
            ["reward_mean", "pass_at_1"],
            "Reward and pass@1 by policy version",
            x_type="O",
        )
        thin = [r["policy_version"] for r in rows if r["n_tasks"] < ctx.min_tasks]
        if thin:
            st.caption(
                f"pass@1 hidden at {len(thin)} version(s) scored on fewer than {ctx.min_tasks} tasks "
                f"({', '.join(map(str, thin[:8]))}{', …' if len(thin) > 8 else ''}); n_tasks is in the table."
            )
    with right:
        if curve.num_rows:
            pass_at_k_chart(curve, "pass@k and the tasks it covers")
            st.caption(curve_basis(points, ctx.min_tasks))
        else:
            empty_state("scored trajectories", "pass@k needs finished trajectories with a reward.")
    st.subheader("By policy version")
    st.dataframe(frame(by_version), hide_index=True, key="overview_table")
