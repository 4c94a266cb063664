"""Trajectory browser: filter trajectories, open one: turns, tool calls, errors, tokens shaded by logprob."""

from __future__ import annotations

import html
import math
from typing import Any

import streamlit as st

from trajlake.dashboards.views.common import PageContext, empty_state, fmt, frame
from trajlake.schemas.events import FAILURE_ORIGINS, STATUSES

MAX_TOKENS_SHOWN = 4000
"""Tokens rendered per turn; the rest is summarised (a long turn would freeze the browser)."""


@st.cache_resource(show_spinner=False)
def load_tokenizer(path: str) -> Any:
    """A Hugging Face `tokenizers` tokenizer from its JSON file."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def token_texts(ids: list[int], tokenizer: Any) -> list[str]:
    """Each id's text: the tokenizer's decoding when one is configured, else `#id`."""
    if tokenizer is None:
        return [f"#{i}" for i in ids]
    return [
        tokenizer.decode([i], skip_special_tokens=False) or tokenizer.id_to_token(i) or f"#{i}" for i in ids
    ]


def shade(logprob: float | None) -> str:
    """Background for a sampled token: white when certain (p≈1), deeper red as p falls."""
    if logprob is None:
        return "#e8e8e8"
    p = math.exp(min(0.0, logprob))
    return f"rgba(214, 39, 40, {0.85 * (1 - p):.2f})"


def tokens_html(turn: dict[str, Any], tokenizer: Any) -> str:
    """One turn's appended input (grey) and sampled output (shaded by logprob) as HTML spans."""
    inputs = list(turn["input_token_ids"] or [])
    outputs = list(turn["output_token_ids"] or [])
    logprobs = list(turn["output_logprobs"] or [])
    ids = (inputs + outputs)[:MAX_TOKENS_SHOWN]
    spans = []
    gap = "" if tokenizer else ";margin-right:3px"  # bare ids need a gap to stay readable
    for pos, (tok, text) in enumerate(zip(ids, token_texts(ids, tokenizer), strict=True)):
        if pos < len(inputs):
            style, tip = "background:#e8e8e8;color:#555", f"input id {tok}"
        else:
            lp = logprobs[pos - len(inputs)]
            style, tip = f"background:{shade(lp)}", f"id {tok}, logprob {lp:.3f}"
        spans.append(f'<span class="tok" title="{tip}" style="{style}{gap}">{html.escape(text)}</span>')
    hidden = len(inputs) + len(outputs) - len(ids)
    more = f"<em> … {hidden} more tokens</em>" if hidden > 0 else ""
    return (
        '<div style="font-family:monospace;white-space:pre-wrap;overflow-wrap:anywhere;line-height:1.7">'
        + "".join(spans)
        + more
        + "</div>"
    )


def render(ctx: PageContext) -> None:
    st.header("Trajectory browser")
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
    cols = st.columns(5)
    cols[0].metric("Task", summary["task_id"])
    cols[1].metric("Reward", fmt(summary["reward"]))
    cols[2].metric("Status", summary["status"] or "running")
    cols[3].metric("Turns", summary["n_turns"])
    cols[4].metric("Policy versions", f"{summary['policy_version_min']}–{summary['policy_version_max']}")
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
    tokenizer = load_tokenizer(ctx.tokenizer_path) if ctx.tokenizer_path else None
    st.caption(
        "Grey: input the environment appended. Red shading: sampled tokens, deeper as the logprob falls."
        + ("" if tokenizer else " Set --tokenizer (TRAJLAKE_TOKENIZER) to a tokenizer.json to see text.")
    )
    turns = ctx.metric("trajectory_turns", ctx.run_id, trajectory_id)
    for turn in turns.to_pylist():
        label = (
            f"Turn {turn['turn_index']} · v{turn['policy_version']} · {turn['n_input_tokens']} in / "
            f"{turn['n_output_tokens']} out · {turn['finish_reason'] or ''}"
            + (" · nudged" if turn["nudged"] else "")
            + (" · TITO drift" if turn["tito_drift"] else "")
        )
        with st.expander(label, expanded=turn["turn_index"] == 0):
            st.html(tokens_html(turn, tokenizer))
    st.subheader("Tool calls")
    if calls.num_rows:
        st.dataframe(frame(calls), hide_index=True, key="browser_calls")
    else:
        empty_state("tool calls", "This trajectory called no tools.")
