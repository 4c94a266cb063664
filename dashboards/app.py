"""The trajlake Streamlit app (`trajlake dashboard` runs `streamlit run` on this file).

Settings are `AppSettings` (lake root, tokenizer, success threshold), read from the environment
that `trajlake dashboard` sets from its options. The page is in the URL (`?page=entropy`), so a
page can be linked and opened directly.
"""

from __future__ import annotations

import streamlit as st

from trajlake.dashboards import metrics
from trajlake.dashboards.config import AppSettings
from trajlake.dashboards.views import (
    async_health,
    behaviour,
    browser,
    entropy,
    failures,
    overview,
    sql_console,
)
from trajlake.dashboards.views.common import PageContext, open_lake

PAGES = {
    "overview": ("Run overview", overview.render),
    "entropy": ("Entropy", entropy.render),
    "behaviour": ("Behaviour", behaviour.render),
    "failures": ("Failures", failures.render),
    "async": ("Async health", async_health.render),
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


def choose_run(lake) -> str | None:
    """The run selector (newest run first; `?run=` preselects one)."""
    runs = metrics.runs(lake)
    if not runs:
        return None
    wanted = st.query_params.get("run")
    run_id = st.sidebar.selectbox("Run", runs, index=runs.index(wanted) if wanted in runs else 0, key="run")
    st.query_params["run"] = run_id
    return run_id


def choose_versions(lake, run_id: str) -> tuple[int, int] | None:
    """The policy-version range selector (None = every version)."""
    versions = metrics.policy_versions(lake, run_id)
    if len(versions) < 2:
        return None
    low, high = st.sidebar.select_slider(
        "Policy versions", options=versions, value=(versions[0], versions[-1]), key=f"versions:{run_id}"
    )
    return None if (low, high) == (versions[0], versions[-1]) else (int(low), int(high))


def main() -> None:
    st.set_page_config(page_title="trajlake", page_icon=":material/monitoring:", layout="wide")
    settings = AppSettings.from_env()
    root = settings.lake
    st.sidebar.title("trajlake")
    page = choose_page()
    try:
        lake = open_lake(root)
    except FileNotFoundError as err:
        st.error(str(err))
        return
    run_id = choose_run(lake)
    if run_id is None:
        st.info(
            f"The lake at `{root}` holds no trajectories yet. Run `trajlake loadgen --lake {root} "
            "--trajectories 200` or `trajlake demo` to fill it."
        )
        return
    versions = choose_versions(lake, run_id)
    threshold = st.sidebar.number_input(
        "Pass threshold (reward ≥)",
        value=settings.success_threshold,
        step=0.1,
        key="threshold",
    )
    if st.sidebar.button("Refresh", help="Reread the lake now instead of within 15 s"):
        st.cache_data.clear()
    st.sidebar.caption(f"Lake: `{root}`")
    ctx = PageContext(root, run_id, versions, float(threshold), settings.tokenizer or None)
    PAGES[page][1](ctx)


main()
