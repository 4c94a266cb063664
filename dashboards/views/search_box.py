"""The browser's search box: a regex or a run of token ids in the run's turns, counted per policy version.

A search that the plan says takes longer than the page-time goal says so before it starts, and
shows its progress (tokens read, time left) while it reads; its result stays on the page.
"""

from __future__ import annotations

import time
from typing import Any

import streamlit as st

from trajlake.dashboards.views.charts import bars
from trajlake.dashboards.views.common import PageContext, frame

PAGE_GOAL_S = 2.0
"""A page answers within this; a longer search says how long it will take and shows progress."""
LISTED = 200


def render(ctx: PageContext) -> None:
    """The search form, and the last search's result for this run."""
    held = st.session_state.get("search_result")
    with st.expander("Search this run's turns", expanded=held is not None, icon=":material/search:"):
        with st.form("search_form", border=False):
            cols = st.columns([1, 3, 1])
            kind = cols[0].radio("Search for", ["regex", "token ids"], key="search_kind", horizontal=True)
            pattern = cols[1].text_input(
                "Pattern", key="search_pattern", placeholder="import pdfplumber   (token ids: 4,6)"
            )
            scope = cols[2].selectbox("In", ["output", "input", "all"], key="search_scope")
            go = st.form_submit_button("Search", icon=":material/search:")
        if go:
            held = run_search(ctx, kind, pattern, scope)
            st.session_state["search_result"] = held
        if held is not None and held["run_id"] == ctx.run_id:
            show(ctx, held)


def run_search(ctx: PageContext, kind: str, pattern: str, scope: str) -> dict[str, Any] | None:
    """Plan and run one search with a progress bar; None (and an error shown) if it cannot run."""
    from trajlake.store.search import SearchError, SearchQuery, plan, search
    from trajlake.store.tokenizer import TokenizerNotFound

    try:
        tokens = (
            tuple(int(t) for t in pattern.replace(" ", "").split(",") if t) if kind == "token ids" else None
        )
        query = SearchQuery(ctx.run_id, pattern if kind == "regex" else None, tokens, scope, LISTED,  # type: ignore[arg-type]
                            ctx.tokenizer_path)  # fmt: skip
        the_plan = plan(ctx.lake, query)
    except ValueError:
        st.error(f"Token ids are whole numbers separated by commas, e.g. 4,6 (got {pattern!r}).")
        return None
    except SearchError as err:
        st.error(str(err))
        return None
    if the_plan.estimate_s > PAGE_GOAL_S:
        st.info(
            f"This search reads {the_plan.tokens:,} {scope} tokens in {len(the_plan.files):,} files: about "
            f"{the_plan.estimate_s:.0f} s on this machine.",
            icon=":material/schedule:",
        )
    bar = st.progress(0.0, text="Searching …")
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        spent = time.monotonic() - started
        left = spent * (total - done) / done if done else the_plan.estimate_s
        bar.progress(
            min(done / max(total, 1), 1.0),
            text=f"{done:,} of {total:,} tokens read · about {left:.0f} s left",
        )

    try:
        result = search(ctx.lake, query, the_plan, progress)
    except TokenizerNotFound as err:
        bar.empty()
        st.error(f"{err} to `trajlake dashboard` (or search token ids).")
        return None
    bar.empty()
    return {"run_id": ctx.run_id, "what": f"{kind} {pattern!r} in {scope} tokens", "versions": result.versions_table(),
            "hits": result.hits, "turns_hit": result.turns_hit, "matches": result.matches,
            "trajectories_hit": result.trajectories_hit, "tokens": result.tokens_read, "seconds": result.seconds}  # fmt: skip


def show(ctx: PageContext, held: dict[str, Any]) -> None:
    """A search's counts per policy version and the turns it hit."""
    st.caption(
        f"{held['what']}: {held['matches']:,} matches in {held['turns_hit']:,} turns of "
        f"{held['trajectories_hit']:,} trajectories; read {held['tokens']:,} tokens in {held['seconds']:.2f} s."
    )
    versions = held["versions"]
    if held["turns_hit"]:
        bars(versions, "policy_version", "turns_hit", "Turns hit per policy version", x_type="O", wide=True)
    st.dataframe(frame(versions), hide_index=True, key="search_versions")
    if held["hits"]:
        import pandas as pd

        hits = pd.DataFrame(held["hits"])
        hits.insert(
            0, "open", [f"?page=browser&run={ctx.run_id}&trajectory={t}" for t in hits["trajectory_id"]]
        )
        st.dataframe(hits, hide_index=True, key="search_hits",
                     column_config={"open": st.column_config.LinkColumn("open", display_text="open")})  # fmt: skip
