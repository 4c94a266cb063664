"""The trajlake Streamlit app (`trajlake dashboard` runs `streamlit run` on this file).

Settings are `AppSettings` (lake root, tokenizer, success threshold), read from the environment
that `trajlake dashboard` sets from its options. The page is in the URL (`?page=entropy`), so a
page can be linked and opened directly; so is the live view (`?live=10`: reread the lake and
redraw the page every 10 s, to watch a running job).

Every read is cached under the Delta versions of the lake's tables (`lake_state`), so a rerun
reads again only after a commit. The page is a fragment: a live tick reruns just the page (it
polls the versions again), not the sidebar.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace

import streamlit as st

from trajlake.dashboards.config import MAX_LIVE_INTERVAL_S, AppSettings
from trajlake.dashboards.views import (
    async_health,
    behaviour,
    browser,
    compare,
    entropy,
    failures,
    health,
    latency,
    overview,
    rescore,
    sql_console,
)
from trajlake.dashboards.views.common import PageContext, lake_state, open_lake, read_metric

PAGES = {
    "overview": ("Run overview", overview.render),
    "entropy": ("Entropy", entropy.render),
    "behaviour": ("Behaviour", behaviour.render),
    "failures": ("Failures", failures.render),
    "async": ("Async health", async_health.render),
    "compare": ("Compare runs", compare.render),
    "latency": ("Latency & lengths", latency.render),
    "health": ("Health signals", health.render),
    "rescore": ("Re-scoring", rescore.render),
    "browser": ("Trajectory browser", browser.render),
    "sql": ("SQL console", sql_console.render),
}


def choose_page() -> str:
    """The page from the sidebar, kept in sync with `?page=` in the URL."""
    wanted = st.query_params.get("page", "overview")
    keys = list(PAGES)
    page = st.sidebar.radio(
        "Page",
        keys,
        index=keys.index(wanted) if wanted in PAGES else 0,
        format_func=lambda k: PAGES[k][0],
        key="page",
    )
    st.query_params["page"] = page
    return page


def live_from_url(value: str | None) -> int | None:
    """Seconds between live ticks from `?live=` (None = off: absent, not a whole number, or < 1)."""
    try:
        seconds = int(value or "")
    except ValueError:
        return None
    return min(seconds, MAX_LIVE_INTERVAL_S) if seconds >= 1 else None


def choose_live(default_s: int) -> int | None:
    """The Live toggle and its interval, kept in sync with `?live=<seconds>` (None = off)."""
    wanted = live_from_url(st.query_params.get("live"))
    left, right = st.sidebar.columns([1, 1], vertical_alignment="bottom")
    on = left.toggle(
        "Live",
        value=wanted is not None,
        key="live",
        help="Reread the lake and redraw this page every few seconds, to watch a running job",
    )
    every = right.number_input(
        "Every (s)",
        min_value=1,
        max_value=MAX_LIVE_INTERVAL_S,
        value=wanted or default_s,
        step=1,
        key="live_s",
    )
    if on:
        st.query_params["live"] = str(int(every))
    elif "live" in st.query_params:
        del st.query_params["live"]
    return int(every) if on else None


def choose_run(root: str, state: tuple[int, ...]) -> str | None:
    """The run selector (newest run first; `?run=` preselects one)."""
    runs = read_metric(root, state, "runs")
    if not runs:
        return None
    wanted = st.query_params.get("run")
    run_id = st.sidebar.selectbox("Run", runs, index=runs.index(wanted) if wanted in runs else 0, key="run")
    st.query_params["run"] = run_id
    return run_id


def choose_versions(root: str, state: tuple[int, ...], run_id: str) -> tuple[int, int] | None:
    """The policy-version range selector (None = every version).

    A range left at every version keeps covering every version as new ones are committed (a
    running job adds them); a narrowed range stays as chosen.
    """
    versions = read_metric(root, state, "policy_versions", run_id)
    if len(versions) < 2:
        return None
    key, every = f"versions:{run_id}", (versions[0], versions[-1])
    seen = st.session_state.get(f"{key}:every")
    if seen not in (None, every) and tuple(st.session_state.get(key, ())) == seen:
        st.session_state[key] = every
    st.session_state[f"{key}:every"] = every
    low, high = st.sidebar.select_slider("Policy versions", options=versions, value=every, key=key)
    return None if (low, high) == every else (int(low), int(high))


def main() -> None:
    st.set_page_config(page_title="trajlake", page_icon=":material/monitoring:", layout="wide")
    settings = AppSettings.from_env()
    root = settings.lake
    st.sidebar.title("trajlake")
    page = choose_page()
    try:
        open_lake(root)
    except FileNotFoundError as err:
        st.error(str(err))
        return
    live_s = choose_live(settings.live_interval_s)
    state = lake_state(root)
    run_id = choose_run(root, state)
    if run_id is None:
        st.fragment(wait_for_a_run, run_every=live_s)(root)
        return
    versions = choose_versions(root, state, run_id)
    threshold = st.sidebar.number_input(
        "Pass threshold (reward ≥)",
        value=settings.success_threshold,
        step=0.1,
        key="threshold",
    )
    st.sidebar.button(
        "Refresh", help="Reread the lake now (every rerun reads the commits made since the last)"
    )
    st.sidebar.caption(f"Lake: `{root}`")
    ctx = PageContext(
        root, run_id, versions, float(threshold), settings.tokenizer or None, settings.min_tasks
    )
    sidebar = sidebar_lists(root, state, run_id)
    st.fragment(show_page, run_every=live_s)(PAGES[page][1], ctx, live_s, sidebar)


def sidebar_lists(root: str, state: tuple[int, ...], run_id: str) -> tuple:
    """What the sidebar's selectors offer at lake state `state`: the runs and the run's versions."""
    runs = read_metric(root, state, "runs")
    return tuple(runs), tuple(read_metric(root, state, "policy_versions", run_id))


def show_page(
    render: Callable[[PageContext], None], ctx: PageContext, live_s: int | None, sidebar: tuple
) -> None:
    """The page over the lake as it is now; a live tick reruns only this function."""
    ctx = replace(ctx, lake_state=lake_state(ctx.lake_root))
    if live_s is not None and sidebar_lists(ctx.lake_root, ctx.lake_state, ctx.run_id) != sidebar:
        st.rerun(scope="app")  # a new run or policy version: redraw the sidebar's selectors too
    render(ctx)
    if live_s is not None:
        now = dt.datetime.now().strftime("%H:%M:%S")
        st.caption(f":material/sync: Live: read the lake at {now}; rereads it every {live_s} s")


def wait_for_a_run(root: str) -> None:
    """The note on an empty lake; live, it opens the first run as soon as one is committed."""
    if read_metric(root, lake_state(root), "runs"):
        st.rerun(scope="app")
    st.info(
        f"The lake at `{root}` holds no trajectories yet. Run `trajlake loadgen --lake {root} "
        "--trajectories 200` or `trajlake demo` to fill it."
    )


main()
