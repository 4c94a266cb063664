"""Entropy: the trainer-reported entropy and the rollout estimate (−mean logprob of sampled tokens)."""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards.views.charts import line
from trajlake.dashboards.views.common import PageContext, empty_state, fmt, frame, tiles


def render(ctx: PageContext) -> None:
    st.header("Entropy")
    rollout = ctx.metric("rollout_entropy", ctx.run_id, ctx.versions)
    trainer = ctx.metric("trainer_entropy", ctx.run_id)
    cols = tiles(2)
    latest = rollout.to_pylist()[-1] if rollout.num_rows else None
    cols[0].metric(
        "Rollout entropy, latest version",
        fmt(latest and latest["entropy"]),
        help="−mean logprob of the sampled tokens of the latest policy version in the selection",
    )
    cols[1].metric(
        "Trainer entropy (latest step)",
        fmt(trainer.column("entropy")[-1].as_py() if trainer.num_rows else None),
    )
    left, right = st.columns(2)
    with left:
        if rollout.num_rows:
            line(rollout, "policy_version", "entropy", "Rollout: −mean logprob of sampled tokens", x_type="O")
        else:
            empty_state("turns", "The rollout estimate needs recorded turns.")
    with right:
        if trainer.num_rows:
            line(trainer, "step", "entropy", "Trainer-reported entropy per step")
        else:
            empty_state(
                "trainer steps", "The trainer writes `trainer_steps` once it starts; this chart fills then."
            )
    st.dataframe(frame(rollout), hide_index=True, key="entropy_table")
