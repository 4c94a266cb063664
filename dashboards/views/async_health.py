"""Async health: staleness at consumption, zero-signal groups per step, buffer composition,
logprob mismatch, ingest lag."""

from __future__ import annotations

import pyarrow as pa
import streamlit as st

from trajlake.dashboards.metrics import CATEGORIES, MISMATCH_THRESHOLD
from trajlake.dashboards.views.charts import area, bars, line
from trajlake.dashboards.views.common import PageContext, empty_state, fmt, tiles


def mismatch_text(value: float) -> str:
    """A mismatch as a figure: 4 decimals, or scientific below 1e-3 (float32 engines sit near 1e-7)."""
    return f"{value:.4f}" if value == 0 or value >= 1e-3 else f"{value:.2e}"


SIGNAL = ["zero signal (all rewards equal)", "with signal"]
"""How the zero-signal chart splits each step's consumed groups, in colour order."""


def signal_split(table: pa.Table) -> pa.Table:
    """`zero_signal_groups` in long form: per step, groups with and without signal (for stacked bars)."""
    steps, zero, total = (table.column(c).to_pylist() for c in ("step", "n_zero_signal_groups", "n_groups"))
    return pa.table(
        {
            "step": steps + steps,
            "signal": [SIGNAL[0]] * len(steps) + [SIGNAL[1]] * len(steps),
            "n_groups": zero + [t - z for t, z in zip(total, zero, strict=True)],
        }
    )


def render_zero_signal(ctx: PageContext) -> None:
    """The consumed groups per trainer step whose rewards were all equal: compute for no gradient."""
    st.subheader("Zero-signal groups")
    table = ctx.metric("zero_signal_groups", ctx.run_id)
    steps = table.to_pylist()
    zero, groups = sum(r["n_zero_signal_groups"] for r in steps), sum(r["n_groups"] for r in steps)
    cols = tiles(2)
    cols[0].metric(
        "Zero-signal groups (latest step)",
        f"{steps[-1]['n_zero_signal_groups']} of {steps[-1]['n_groups']}" if steps else "–",
        help="consumed prompt groups whose rewards were all equal: every advantage is 0, no gradient",
    )
    cols[1].metric("Zero-signal share (whole run)", f"{zero / groups:.1%}" if groups else "–")
    if table.num_rows:
        bars(
            signal_split(table),
            "step",
            "n_groups",
            "Consumed groups per trainer step, zero signal vs with signal",
            color="signal",
            x_type="O",
            domain=SIGNAL,
            wide=True,
        )
    else:
        empty_state("consumed batches", "Each trainer step's groups show here once it commits its batch.")


def render(ctx: PageContext) -> None:
    st.header("Async health")
    staleness = ctx.metric("staleness_distribution", ctx.run_id)
    mismatch = ctx.metric("logprob_mismatch", ctx.run_id)
    lag = ctx.metric("ingest_lag", ctx.run_id)
    cols = tiles(5)
    counts = staleness.to_pylist()
    n = sum(r["n_trajectories"] for r in counts)
    cols[0].metric(
        "Mean staleness", fmt(sum(r["staleness"] * r["n_trajectories"] for r in counts) / n, 2) if n else "–"
    )
    cols[1].metric("Max staleness", str(max(r["staleness"] for r in counts)) if counts else "–")
    last = mismatch.to_pylist()[-1] if mismatch.num_rows else None
    cols[2].metric(
        "Logprob mismatch (latest step)",
        "–" if last is None or last["mismatch"] is None else mismatch_text(last["mismatch"]),
        None if last is None else ("healthy" if last["healthy"] else f"above {MISMATCH_THRESHOLD}"),
        delta_color="normal" if last is None or last["healthy"] else "inverse",
    )
    lag_rows = lag.to_pylist()
    cols[3].metric("Ingest lag p95 (latest)", f"{lag_rows[-1]['lag_p95_s']:.2f} s" if lag_rows else "–")
    since = ctx.metric("freshness_s", ctx.run_id)
    cols[4].metric(
        "Since the last event",
        "–" if since is None else f"{since:,.0f} s",
        help="now − the run's latest event_time: how long rollouts have been quiet",
    )

    left, right = st.columns(2)
    with left:
        if staleness.num_rows:
            bars(
                staleness,
                "staleness",
                "n_trajectories",
                "Staleness at consumption (trainer version − policy version)",
                x_type="O",
            )
        else:
            empty_state(
                "consumed batches", "The trainer records each batch it samples in `batch_consumption`."
            )
    with right:
        if mismatch.num_rows:
            line(
                mismatch,
                "step",
                "mismatch",
                f"Train/inference logprob mismatch (healthy < {MISMATCH_THRESHOLD})",
            )
        else:
            empty_state(
                "trainer steps", "The trainer reports the logprob mismatch per step in `trainer_steps`."
            )
    render_zero_signal(ctx)
    st.subheader("Buffer composition")
    by = st.radio(
        "Split by",
        ["difficulty", "length"],
        horizontal=True,
        key="buffer_by",
        format_func={"difficulty": "task difficulty", "length": "trajectory length"}.get,
    )
    arrivals = ctx.metric("buffer_composition", ctx.run_id, by, "arrivals", ctx.success_threshold)
    consumed = ctx.metric("buffer_composition", ctx.run_id, by, "consumption", ctx.success_threshold)
    left, right = st.columns(2)
    with left:
        if arrivals.num_rows:
            area(
                arrivals,
                "bucket_start",
                "n_trajectories",
                "category",
                "Arrivals over time (finished trajectories)",
                normalize=True,
                domain=CATEGORIES[by],
            )
        else:
            empty_state("finished trajectories", "Arrivals show up as trajectories finish.")
    with right:
        if consumed.num_rows:
            bars(
                consumed,
                "step",
                "n_trajectories",
                "Consumed per trainer step",
                color="category",
                x_type="O",
                domain=CATEGORIES[by],
            )
        else:
            empty_state("consumed batches", "Per-step composition appears once the trainer samples.")
    st.subheader("Ingest lag")
    if lag.num_rows:
        line(
            lag,
            "bucket_start",
            ["lag_p50_s", "lag_p95_s", "lag_max_s"],
            "Ingest lag (file write time − event time)",
            x_type="T",
            y_title="seconds",
            wide=True,
        )
    else:
        empty_state("events", "Ingest lag is measured on the events the sink wrote (local lakes).")
