"""Re-scoring: the run's verifier versions, and the trajectories and tasks whose pass/fail flipped between two."""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards.views.charts import bars
from trajlake.dashboards.views.common import PageContext, empty_state, frame, tiles
from trajlake.store.rewards import LATEST, ORIGINAL


def render(ctx: PageContext) -> None:
    st.header("Re-scoring")
    versions = ctx.metric("verifier_versions", ctx.run_id)
    if len(versions) < 2:
        empty_state(
            "re-scores of this run",
            f"Score its trajectories again with `trajlake rescore --run {ctx.run_id} --verifier MODULE:FUNC`; "
            "each version's rewards are kept, and this page compares any two.",
        )
        if versions:
            st.dataframe(frame_of(versions), hide_index=True, key="rescore_versions")
        return
    st.caption(
        "Every verifier version that scored this run (`original`: the rewards recorded with the episodes)."
    )
    st.dataframe(frame_of(versions), hide_index=True, key="rescore_versions")
    names = [ORIGINAL, *(v["version"] for v in versions if v["version"] != ORIGINAL), LATEST]
    left, right = st.columns(2)
    a = left.selectbox("Compare", names, index=0, key="rescore_a")
    b = right.selectbox("with", names, index=len(names) - 2, key="rescore_b")
    threshold = ctx.success_threshold
    counts = ctx.metric("flip_counts", ctx.run_id, a, b, threshold)
    compared = sum(counts.values())
    cols = tiles(4)
    cols[0].metric("Compared", f"{compared:,}", help="Trajectories both versions scored or tried to")
    cols[1].metric("Fail → pass", f"{counts.get('fail → pass', 0):,}")
    cols[2].metric("Pass → fail", f"{counts.get('pass → fail', 0):,}")
    newly = sum(
        n for flip, n in counts.items() if flip.startswith("unscored → ") and flip != "unscored → unscored"
    )
    cols[3].metric("Scored now", f"{newly:,}", help="No valid reward before (its verifier raised), one now")
    st.caption(f"A trajectory passes when its reward is ≥ {threshold:g} (the sidebar's threshold).")
    flips = ctx.metric("verdict_flips", ctx.run_id, a, b, threshold)
    if not flips.num_rows:
        st.success(f"No trajectory passes or fails differently under {a} and {b}.")
        return
    tasks = ctx.metric("task_flips", ctx.run_id, a, b, threshold)
    st.subheader("Tasks whose trajectories flipped")
    st.dataframe(frame(tasks), hide_index=True, key="rescore_tasks")
    by_flip = flips.group_by("flip").aggregate([([], "count_all")]).rename_columns(["flip", "n_trajectories"])
    bars(by_flip, "flip", "n_trajectories", f"Verdict changes from {a} to {b}", horizontal=True)
    st.subheader(f"Trajectories whose verdict flipped ({flips.num_rows:,})")
    table = frame(flips.select(["trajectory_id", "task_id", "flip", "reward_a", "reward_b", "error_b"]))
    table.insert(
        0, "open", [f"?page=browser&run={ctx.run_id}&trajectory={t}" for t in table["trajectory_id"]]
    )
    st.dataframe(
        table,
        hide_index=True,
        key="rescore_flips",
        column_config={"open": st.column_config.LinkColumn("open", display_text="open")},
    )


def frame_of(rows: list[dict]) -> object:
    """Rows of dicts as a frame for st.dataframe."""
    import pandas as pd

    return pd.DataFrame(rows)
