"""Compare runs: several runs overlaid by policy version and by trainer step, one line per run.

The runs are picked on the page and kept in the URL (`?page=compare&runs=a,b`); by default the
sidebar's run and the newest other one. The figures are those of `trajlake metrics --runs`.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from trajlake.dashboards import compare
from trajlake.dashboards.metrics import MISMATCH_THRESHOLD
from trajlake.dashboards.passk import curve_basis
from trajlake.dashboards.views.charts import MAX_SERIES, pass_at_k_chart, small_multiples
from trajlake.dashboards.views.common import (
    CACHE_TTL_S,
    PageContext,
    empty_state,
    frame,
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


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def read_comparison(
    root: str,
    state: tuple[int, ...],
    name: str,
    run_ids: tuple[str, ...],
    success_threshold: float,
    min_tasks: int,
) -> Any:
    """`compare.<name>(lake, run_ids, success_threshold, min_tasks)`, cached for the lake's tables at versions `state`."""
    return getattr(compare, name)(open_lake(root), list(run_ids), success_threshold, min_tasks)


def choose_runs(runs: list[str], current: str) -> list[str]:
    """The compared runs, kept in sync with `?runs=a,b` (default: `current` and the newest other run)."""
    wanted = [r for r in st.query_params.get("runs", "").split(",") if r]
    unknown = [r for r in wanted if r not in runs]
    if unknown:
        st.warning(f"Not in this lake, left out: {', '.join(unknown)}. Runs here: {', '.join(runs)}.")
    default = ([r for r in wanted if r in runs] or [current, *[r for r in runs if r != current][:1]])[
        :MAX_SERIES
    ]
    chosen = st.multiselect(
        "Runs", runs, default=default, key="compare_runs", max_selections=MAX_SERIES,
        help=f"newest first; up to {MAX_SERIES}, a colour each",
    )  # fmt: skip
    if chosen:
        st.query_params["runs"] = ",".join(chosen)
    elif "runs" in st.query_params:
        del st.query_params["runs"]
    return chosen


def render(ctx: PageContext) -> None:
    st.header("Compare runs")
    run_ids = tuple(choose_runs(read_metric(ctx.lake_root, ctx.lake_state, "runs"), ctx.run_id))
    if not run_ids:
        st.info("Pick one or more runs to compare.", icon=":material/compare_arrows:")
        return

    def read(name: str) -> Any:
        return read_comparison(
            ctx.lake_root, ctx.lake_state, name, run_ids, ctx.success_threshold, ctx.min_tasks
        )

    versions, steps, curves = read("by_version"), read("by_step"), read("pass_at_k_curves")
    st.dataframe(frame(compare.summary(versions, steps, curves)), hide_index=True, key="compare_summary")
    st.caption(
        f"pass_at_k is at k, the largest k every compared run shows (at least {ctx.min_tasks} tasks with k "
        "scored samples), over n_tasks_at_k of its n_tasks tasks; mismatch_latest is the last trainer step's; "
        "rates are shares of all trajectories."
    )

    st.subheader("By policy version")
    if versions.num_rows:
        hidden = {
            "pass_at_1": f"Hidden at every version: each was scored on fewer than {ctx.min_tasks} tasks."
        }
        small_multiples(versions, "policy_version", BY_VERSION, "O", list(run_ids), hidden)
    else:
        empty_state(
            "policy versions for these runs", "Trajectories carry the policy version that started them."
        )
    if curves.num_rows:
        pass_at_k_chart(curves, "pass@k and the tasks it covers", list(run_ids), wide=True)
        for run_id in run_ids:
            curve = [r for r in curves.to_pylist() if r["run_id"] == run_id]
            st.caption(f"{run_id}: {curve_basis(curve, ctx.min_tasks)}")
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
    hidden = {"pass_at_1": f"Hidden at every step: each consumed fewer than {ctx.min_tasks} tasks."}
    small_multiples(steps, "step", BY_STEP, "Q", list(run_ids), hidden)
    with st.expander("Figures by trainer step"):
        st.dataframe(frame(steps), hide_index=True, key="compare_steps")
