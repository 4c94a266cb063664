"""The browser's panels on one trajectory: its labels (and a form to label it or a turn), its rewards per
verifier version."""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards.views.common import PageContext, frame

SUGGESTED_KEYS = ("env_bug", "reward_hack", "verifier_wrong", "good_example")
"""Keys the form offers first; any other word may be typed."""


def render_labels(ctx: PageContext, trajectory_id: str, n_turns: int) -> None:
    """The labels in force on the trajectory and its turns, and the labelling form."""
    from trajlake.store.labels import default_author

    st.subheader("Labels")
    flash = st.session_state.pop("label_flash", None)
    if flash:
        st.success(flash)
    labels = ctx.metric("trajectory_labels", ctx.run_id, trajectory_id)
    if labels.num_rows:
        st.dataframe(frame(labels), hide_index=True, key="browser_labels")
    else:
        st.caption(
            "No labels yet. A label marks the trajectory (or one turn) for the sampler, doctor and export."
        )
    targets = ["the whole trajectory", *(f"turn {i}" for i in range(n_turns))]
    with st.form("label_form", clear_on_submit=False, border=True):
        cols = st.columns([2, 2, 2, 2])
        key = cols[0].selectbox("Label", SUGGESTED_KEYS, key="label_key", accept_new_options=True)
        value = cols[1].text_input("Value", "true", key="label_value")
        target = cols[2].selectbox("On", targets, key="label_target")
        author = cols[3].text_input("Author", default_author(), key="label_author")
        clear = st.checkbox("Clear this label instead", key="label_clear")
        if st.form_submit_button("Add label", icon=":material/label:"):
            _write(ctx, trajectory_id, key, value, targets.index(target) - 1, author, clear)


def _write(
    ctx: PageContext, trajectory_id: str, key: str | None, value: str, turn: int, author: str, clear: bool
) -> None:
    from trajlake.store.labels import LabelError, add_labels, label_rows

    try:
        rows = label_rows(ctx.run_id, [trajectory_id], key or "", None if clear else value, author,
                          None if turn < 0 else turn)  # fmt: skip
        add_labels(ctx.lake, rows)
    except LabelError as err:
        st.error(str(err))
        return
    where = "the trajectory" if turn < 0 else f"turn {turn}"
    st.session_state["label_flash"] = f"Label {key!r} {'cleared' if clear else f'= {value!r}'} on {where}."
    st.rerun()


def render_rewards(ctx: PageContext, trajectory_id: str) -> None:
    """Its reward events when a re-score added some: each verifier version's reward side by side."""
    rewards = ctx.metric("trajectory_rewards", ctx.run_id, trajectory_id)
    if rewards.num_rows > 1:
        st.subheader("Rewards by verifier version")
        st.caption(
            "The latest is the trajectory's reward (`trajlake rescore` adds versions; the Re-scoring page compares them)."
        )
        st.dataframe(frame(rewards), hide_index=True, key="browser_rewards")
