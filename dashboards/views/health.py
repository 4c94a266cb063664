"""Health: the run's learning signals per window of steps, with an alert where each one began.

The same report as `trajlake doctor` (`trajlake.store.health`), with the thresholds of
`HealthSettings` (env TRAJLAKE_HEALTH_*). Signals are judged against the run's own start, so
they cover every policy version whatever the sidebar's range.
"""

from __future__ import annotations

import pyarrow as pa
import streamlit as st

from trajlake.dashboards.views.charts import line
from trajlake.dashboards.views.common import CACHE_TTL_S, PageContext, empty_state, frame, open_lake, tiles
from trajlake.store.config import HealthSettings
from trajlake.store.health import ALERT, NOT_RECORDED, HealthReport, Signal, diagnose_health
from trajlake.store.tokenizer import TokenizerNotFound

CHARTS = {
    "entropy_collapse": ["entropy"],
    "mismatch_acceleration": ["mismatch"],
    "reward_length": ["reward", "corr_alike", "growth"],
    "advantage_drift": ["mean", "abs_mean", "std"],
    "tool_error_spike": ["error_rate", "earlier_rate"],
    "garbled_output": ["share", "repetition", "unprintable"],
}
"""The window figures each signal draws (the rest are in its table)."""


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def read_health(
    root: str, state: tuple[int, ...], run_id: str, settings_json: str, tokenizer: str | None
) -> HealthReport:
    """The run's health report at lake state `state`, for the thresholds in `settings_json`."""
    settings = HealthSettings.model_validate_json(settings_json)
    return diagnose_health(open_lake(root), run_id, settings, tokenizer)


def render(ctx: PageContext) -> None:
    st.header("Health signals")
    settings = HealthSettings.from_env()
    try:
        report = read_health(
            ctx.lake_root, ctx.lake_state, ctx.run_id, settings.model_dump_json(), ctx.tokenizer_path
        )
    except TokenizerNotFound as err:  # the app's --tokenizer override does not load
        st.error(str(err))
        return
    for alert in report.alerts:
        st.warning(alert.message, icon=":material/warning:")
    if not report.alerts:
        st.success(
            f"No alerts: no signal crossed its threshold in any window of {settings.window} steps.",
            icon=":material/check_circle:",
        )
    cols = tiles(len(report.signals))
    for col, sig in zip(cols, report.signals, strict=True):
        col.metric(sig.title, tile(sig), help=f"{sig.status}: {sig.note or sig.threshold}")
    left, right = st.columns(2)
    for i, sig in enumerate(report.signals):
        with left if i % 2 == 0 else right:
            show_signal(sig, settings.window)


def tile(sig: Signal) -> str:
    """What a signal's tile shows: where its alert began, 'n/a' when not recorded, else 'ok'."""
    if sig.alert is not None:
        return f"from {sig.alert.start}"
    return "n/a" if sig.status == NOT_RECORDED else sig.status


def show_signal(sig: Signal, window: int) -> None:
    """One signal: its status and threshold, its figures per window as a chart and a table."""
    st.subheader(sig.title)
    note = f" · {sig.note}" if sig.note else ""
    st.caption(f"**{sig.status}** · threshold: {sig.threshold}{note}")
    if sig.status == NOT_RECORDED:
        empty_state(sig.title + " data", sig.note[:1].upper() + sig.note[1:] + ".")
        return
    table = pa.Table.from_pylist(sig.windows)
    measures = [c for c in CHARTS[sig.name] if c in table.column_names]
    title = f"Per window of {window} {sig.axis}s"
    line(table, "start", measures, title, x_type="O", y_title="", x_title=f"first {sig.axis} of the window")
    if sig.status == ALERT and sig.alert is not None:
        st.caption(f":orange[Began at {sig.axis} {sig.alert.start}.]")
    with st.expander("Figures per window"):
        st.dataframe(frame(table), hide_index=True, key=f"health_{sig.name}")
