"""Behaviour: turns, assistant tokens per turn, tool success per tool, code execution, context, nudges."""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards.views.charts import bars, line
from trajlake.dashboards.views.common import PageContext, empty_state, fmt, frame, tiles

RATIOS = ["tool_success_rate", "code_exec_ratio", "context_exhaustion_ratio", "nudge_rate", "tito_drift_rate"]


def render(ctx: PageContext) -> None:
    st.header("Behaviour")
    by_version = ctx.metric("behaviour_by_version", ctx.run_id, ctx.versions)
    if not by_version.num_rows:
        empty_state("finished trajectories", "Behaviour figures appear once trajectories finish.")
        return
    latest = by_version.to_pylist()[-1]
    cols = tiles(6)
    cols[0].metric("Turns / trajectory", fmt(latest["turns_per_trajectory"], 2))
    cols[1].metric("Assistant tokens / turn", fmt(latest["assistant_tokens_per_turn"], 1))
    cols[2].metric("Tool success rate", fmt(latest["tool_success_rate"]))
    cols[3].metric("Code-execution ratio", fmt(latest["code_exec_ratio"]))
    cols[4].metric("Context exhaustion", fmt(latest["context_exhaustion_ratio"]))
    cols[5].metric("Nudged", fmt(latest["nudge_rate"]))
    st.caption(f"Latest policy version {latest['policy_version']} in the selection.")

    left, right = st.columns(2)
    with left:
        line(by_version, "policy_version", "turns_per_trajectory", "Turns per trajectory", x_type="O")
        line(by_version, "policy_version", RATIOS, "Rates by policy version", x_type="O", y_title="rate")
    with right:
        line(
            by_version, "policy_version", "assistant_tokens_per_turn", "Assistant tokens per turn", x_type="O"
        )
        hist = ctx.metric("turns_histogram", ctx.run_id, ctx.versions)
        bars(hist, "n_turns", "n_trajectories", "Turns per trajectory (distribution)", x_type="O")
    tools = ctx.metric("tool_stats", ctx.run_id, ctx.versions)
    st.subheader("Tools")
    if tools.num_rows:
        bars(tools, "tool_name", "success_rate", "Tool-call success rate per tool", horizontal=True)
        st.dataframe(frame(tools), hide_index=True, key="tool_table")
    else:
        empty_state("tool calls", "This run's trajectories called no tools.")
    st.dataframe(frame(by_version), hide_index=True, key="behaviour_table")
