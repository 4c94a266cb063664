"""SQL console: read-only DuckDB SQL over every table of the lake."""

from __future__ import annotations

import pyarrow as pa
import streamlit as st

from trajlake.dashboards.views.common import PageContext, frame

MAX_ROWS_SHOWN = 10_000


def default_query(run_id: str) -> str:
    quoted = run_id.replace("'", "''")
    return (
        "SELECT policy_version_min, count(*) AS trajectories, avg(reward) AS reward\n"
        f"FROM trajectories WHERE run_id = '{quoted}'\nGROUP BY ALL ORDER BY 1"
    )


def render(ctx: PageContext) -> None:
    st.header("SQL console")
    st.caption(
        "Read-only DuckDB over every table: events, trajectories, turns, tool_calls, dead_letters, "
        "policy_versions, trainer_steps, batch_consumption. Statements that write are refused. "
        "`detokenize(output_token_ids, model)` shows token ids as text with the run's tokenizer."
    )
    sql = st.text_area("Query", default_query(ctx.run_id), height=140, key="sql_query")
    if st.button("Run", type="primary", key="sql_run") or "sql_result" not in st.session_state:
        st.session_state["sql_result"] = run_query(ctx, sql)
    result = st.session_state["sql_result"]
    if isinstance(result, str):
        st.error(result)
        return
    shown = f" (first {MAX_ROWS_SHOWN:,} shown)" if result.num_rows > MAX_ROWS_SHOWN else ""
    st.caption(f"{result.num_rows:,} rows{shown}")
    st.dataframe(frame(result.slice(0, MAX_ROWS_SHOWN)), hide_index=True, key="sql_result_table")


def run_query(ctx: PageContext, sql: str) -> pa.Table | str:
    """The query's result, or the error message to show (refused writes, unknown columns, …)."""
    import duckdb

    from trajlake.store.errors import LakeError

    ctx.lake.query_engine().tokenizer = ctx.tokenizer_path  # detokenize()'s override, as in `trajlake sql`
    try:
        return ctx.lake.sql(sql)
    except (LakeError, duckdb.Error) as err:  # the user's to fix: show it and keep the page
        return f"{type(err).__name__}: {err}"
