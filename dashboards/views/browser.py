"""Trajectory browser: search the run's turns, filter trajectories, open one: its rewards per verifier version,
its labels (and a form to add one), turns as text with per-token overlays, tool calls, errors."""

from __future__ import annotations

from typing import Any

import streamlit as st

from trajlake.dashboards.browse import recorded_token_fields
from trajlake.dashboards.views import annotate, search_box
from trajlake.dashboards.views.common import PageContext, empty_state, fmt, frame, tiles
from trajlake.dashboards.views.token_overlays import LEGENDS, MAX_TOKENS_SHOWN, OVERLAYS, tokens_html
from trajlake.schemas.events import FAILURE_ORIGINS, STATUSES


def run_decoder(model: str | None, override: str | None) -> tuple[Any, str | None]:
    """The decoder of the run's recorded `model` (or of the app's tokenizer override), or None and
    a note saying why there is none and how to get one."""
    from trajlake.store.tokenizer import TokenizerNotFound, find_decoder

    try:
        return find_decoder(model, override), None
    except TokenizerNotFound as err:
        return (
            None,
            f"Showing token ids, not text: {err} to `trajlake dashboard` (or set TRAJLAKE_TOKENIZER).",
        )


def token_texts(decoder: Any, turn: dict[str, Any]) -> list[str] | None:
    """Each shown token's text from the run's tokenizer (None without one)."""
    if decoder is None:
        return None
    ids = [*(turn["input_token_ids"] or []), *(turn["output_token_ids"] or [])]
    return list(decoder.pieces(ids[:MAX_TOKENS_SHOWN]))


NOT_KEPT = (
    "No trainer step kept this trajectory's per-token values (`trainer_tokens`; "
    "`TrainerConfig.token_values_every` says which steps do)."
)
NOT_RECORDED = {
    "trainer_logprob": f"This run's trainer recorded no per-token trainer logprobs. {NOT_KEPT}",
    "mismatch": "It needs per-token trainer logprobs, which this run's trainer did not record "
    "(the Async health page shows the trainer's per-step mismatch).",
    "trainer_entropy": NOT_KEPT,
    "ratio": NOT_KEPT,
    "loss_action": NOT_KEPT,
    "entropy": "No per-token entropy was recorded for this trajectory (the Entropy page shows it per "
    "policy version).",
    "advantage": "No trainer recorded an advantage for this trajectory (turns.advantage, "
    "batch_consumption.advantage).",
}
"""Why an overlay has nothing to show, for those the lake may lack."""


def turn_advantages(ctx: PageContext, trajectory_id: str, turns: list[dict[str, Any]]) -> list[float | None]:
    """Each turn's advantage: its own (`turns.advantage`), else the trajectory's at its last consuming step."""
    consumed = ctx.metric("trajectory_advantage", ctx.run_id, trajectory_id)
    fallback = consumed["advantage"] if consumed else None
    return [t["advantage"] if t["advantage"] is not None else fallback for t in turns]


STEP_OVERLAYS = ("trainer_logprob", "trainer_entropy", "ratio", "loss_action")
"""The overlays a trainer step's kept values (`trainer_tokens`) give."""


def with_step_values(ctx: PageContext, trajectory_id: str, turns: list[dict[str, Any]]) -> str | None:
    """Put the per-token values the trainer kept at a step the reader picks on each of its turns;
    return where they come from, or None when no step kept any."""
    kept = ctx.metric("trajectory_token_values", ctx.run_id, trajectory_id).to_pylist()
    steps = sorted({k["step"] for k in kept})
    if not steps:
        return None
    step = st.selectbox("Trainer step", steps, index=len(steps) - 1, key="browser_step")
    by_turn = {k["turn_index"]: k for k in kept if k["step"] == step}
    for turn in turns:
        values = by_turn.get(turn["turn_index"])
        if values is not None:
            turn["trainer_logprob"], turn["trainer_entropy"] = values["trainer_logprobs"], values["entropies"]
            turn["ratio"] = values["ratios"]
            flags = zip(values["clipped"], values["masked"], strict=True)
            turn["loss_action"] = [None if m is None else 2 if m else int(bool(c)) for c, m in flags]
    losses = sorted({k["policy_loss"] for k in by_turn.values() if k["policy_loss"]})
    return f"trainer_tokens (step {step}{', ' + ', '.join(losses) if losses else ''})"


def recorded_overlays(
    ctx: PageContext, trajectory_id: str, turns: list[dict[str, Any]], step_source: str | None = None
) -> dict[str, str]:
    """The overlays this trajectory has figures for (overlay → where they come from)."""
    recorded = {"logprob": "output_logprobs", "loss_mask": "loss_mask"}
    for overlay in recorded_token_fields():
        if any(t.get(overlay) is not None for t in turns):
            recorded[overlay] = overlay
    for overlay in STEP_OVERLAYS:
        if step_source and any(t.get(overlay) is not None for t in turns):
            recorded[overlay] = step_source
    if "trainer_logprob" in recorded:
        recorded["mismatch"] = "trainer_logprob"
    if any(t["advantage"] is not None for t in turns):
        recorded["advantage"] = "turns.advantage"
    elif (consumed := ctx.metric("trajectory_advantage", ctx.run_id, trajectory_id)) is not None:
        recorded["advantage"] = f"batch_consumption.advantage (step {consumed['step']})"
    return recorded


def render(ctx: PageContext) -> None:
    st.header("Trajectory browser")
    search_box.render(ctx)
    with st.expander("Filters", expanded=True):
        cols = st.columns(4)
        status = cols[0].multiselect("Status", STATUSES, key="browser_status")
        origin = cols[1].multiselect("Failure origin", [*FAILURE_ORIGINS, "none"], key="browser_origin")
        task = cols[2].text_input("Task id contains", key="browser_task")
        reward = cols[3].slider("Reward", -1.0, 1.0, (-1.0, 1.0), 0.05, key="browser_reward")
    reward_range = None if reward == (-1.0, 1.0) else reward
    found = ctx.metric(
        "find_trajectories", ctx.run_id, ctx.versions, tuple(status), tuple(origin), task, reward_range
    )
    st.caption(f"{found.num_rows} trajectories shown (newest first, at most 200).")
    if not found.num_rows:
        empty_state("matching trajectories", "Loosen the filters or pick another run.")
        return
    st.dataframe(frame(found), hide_index=True, key="browser_list")
    ids = found.column("trajectory_id").to_pylist()
    wanted = st.query_params.get("trajectory")  # a link (e.g. from the latency page) opens that one
    if wanted and wanted not in ids:
        ids.insert(0, wanted)
    chosen = st.selectbox(
        "Open trajectory", ids, index=ids.index(wanted) if wanted else 0, key="browser_open"
    )
    if wanted and chosen != wanted:  # another one picked: the link has been followed
        del st.query_params["trajectory"]
    if chosen:
        render_trajectory(ctx, chosen)


def render_trajectory(ctx: PageContext, trajectory_id: str) -> None:
    summary = ctx.metric("trajectory_summary", ctx.run_id, trajectory_id)
    if summary is None:
        st.warning(f"trajectory {trajectory_id} is not in run {ctx.run_id}")
        return
    st.subheader(f"Trajectory {trajectory_id}")
    cols = tiles(5)
    cols[0].metric("Task", summary["task_id"])
    cols[1].metric("Reward", fmt(summary["reward"]))
    cols[2].metric("Status", summary["status"] or "running")
    cols[3].metric("Turns", summary["n_turns"])
    low, high = summary["policy_version_min"], summary["policy_version_max"]
    cols[4].metric("Policy versions", "unknown" if low is None else f"{low}–{high}")
    errors = []
    if summary["failure_origin"]:
        message = f": {summary['message']}" if summary["message"] else ""
        errors.append(f"**{summary['failure_origin']} failure** ({summary['failure_label']}){message}")
    if summary["verifier_error"]:
        errors.append(f"**verifier error**: {summary['verifier_error']}")
    calls = ctx.metric("trajectory_tool_calls", ctx.run_id, trajectory_id)
    for call in calls.to_pylist():
        if call["ok"] is False:
            errors.append(
                f"**tool error** `{call['tool_name']}`: {call['error_type']}"
                + (" (timed out)" if call["timed_out"] else "")
            )
    for message in errors:
        st.error(message)
    annotate.render_rewards(ctx, trajectory_id)
    annotate.render_labels(ctx, trajectory_id, int(summary["n_turns"] or 0))
    decoder, note = run_decoder(summary["model"], ctx.tokenizer_path)
    if note:
        st.warning(note)
    turns = ctx.metric("trajectory_turns", ctx.run_id, trajectory_id).to_pylist()
    recorded = recorded_overlays(ctx, trajectory_id, turns, with_step_values(ctx, trajectory_id, turns))
    overlay = st.radio(
        "Overlay",
        list(OVERLAYS),
        format_func=lambda o: OVERLAYS[o] + ("" if o in recorded else " (not recorded)"),
        horizontal=True,
        key="browser_overlay",
    )
    advantage = recorded.get("advantage")
    st.caption(
        "Grey italic: environment tokens (prompt and tool output the turn appended; no loss). "
        + LEGENDS[overlay]
        + (f" Advantage from {advantage}." if overlay == "advantage" and advantage else "")
        + (f" Values of {recorded[overlay]}." if overlay in STEP_OVERLAYS and overlay in recorded else "")
    )
    if overlay not in recorded:
        st.info(f"**{OVERLAYS[overlay]}: not recorded.** {NOT_RECORDED[overlay]}", icon=":material/block:")
    scale = max((abs(a) for a in turn_advantages(ctx, trajectory_id, turns) if a is not None), default=1.0)
    for turn, adv in zip(turns, turn_advantages(ctx, trajectory_id, turns), strict=True):
        label = (
            f"Turn {turn['turn_index']} · v{'?' if turn['policy_version'] is None else turn['policy_version']} · "
            f"{turn['n_input_tokens']} in / "
            f"{turn['n_output_tokens']} out"
            + (f" · {turn['finish_reason']}" if turn["finish_reason"] else "")
            + (" · nudged" if turn["nudged"] else "")
            + (" · TITO drift" if turn["tito_drift"] else "")
            + (f" · advantage {adv:.3f}" if adv is not None else "")
        )
        with st.expander(label, expanded=turn["turn_index"] == 0):
            st.html(tokens_html(turn, token_texts(decoder, turn), overlay, adv, scale or 1.0))
    st.subheader("Tool calls")
    if calls.num_rows:
        st.dataframe(frame(calls), hide_index=True, key="browser_calls")
    else:
        empty_state("tool calls", "This trajectory called no tools.")
