"""What every page shares: the page context, cached metric queries, charts and empty states."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import streamlit as st

from trajlake.dashboards import metrics

CACHE_TTL_S = 600
"""How long a query's result stays in memory. Results are keyed on the lake's Delta versions
(`lake_state`), so a new commit is read on the next rerun whatever this is."""


@st.cache_resource(show_spinner=False)
def open_lake(root: str) -> Any:
    """One `Lake` per root for the whole app (its DuckDB engine follows new Delta versions)."""
    from trajlake.store.lake import Lake

    if "://" not in root and not os.path.isdir(root):
        raise FileNotFoundError(
            f"no lake at {root}; pass --lake (or set TRAJLAKE_LAKE) to a lake made by `trajlake loadgen` or `trajlake demo`"
        )
    return Lake(root)


def lake_state(root: str) -> tuple[int, ...]:
    """The current Delta version of every table (a log poll each, about a millisecond locally)."""
    from trajlake.store.lake import TABLES

    lake = open_lake(root)
    return tuple(lake.version(name) for name in TABLES)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def _cached_metric(root: str, state: tuple[int, ...], name: str, args: tuple, kwargs: tuple) -> Any:
    return getattr(metrics, name)(open_lake(root), *args, **dict(kwargs))


def read_metric(root: str, state: tuple[int, ...], name: str, *args: Any, **kwargs: Any) -> Any:
    """`metrics.<name>(lake, *args, **kwargs)`, cached for the lake's tables at versions `state`."""
    return _cached_metric(root, state, name, args, tuple(sorted(kwargs.items())))


@dataclass(frozen=True)
class PageContext:
    """The selections a page renders for: lake root, run, version range, pass threshold, pass@k's basis."""

    lake_root: str
    run_id: str
    versions: tuple[int, int] | None
    success_threshold: float
    tokenizer_path: str | None = None
    min_tasks: int = metrics.MIN_TASKS
    """The fewest tasks a pass@k is shown for (`ThresholdSettings.min_tasks`)."""
    lake_state: tuple[int, ...] = ()
    """The Delta versions the page reads at (see `lake_state`); a new commit makes new cache keys."""

    @property
    def lake(self) -> Any:
        return open_lake(self.lake_root)

    def metric(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """`metrics.<name>(lake, *args, **kwargs)`, computed once per lake state."""
        return read_metric(self.lake_root, self.lake_state, name, *args, **kwargs)


def frame(table: pa.Table) -> Any:
    """A pandas frame for Altair and st.dataframe."""
    return table.to_pandas()


def empty_state(what: str, how: str) -> None:
    """A friendly note where a chart has no data yet."""
    st.info(f"**No {what} yet.** {how}", icon=":material/hourglass_empty:")


def tiles(n: int) -> list[Any]:
    """`n` places for `st.metric` tiles, side by side while they fit and wrapping when they do not,
    each as wide as its label: a label is never cut (`st.columns` cut them at 1000 px)."""
    row = st.container(horizontal=True, gap="large")
    return [row.container(width="content") for _ in range(n)]


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure as shown in st.metric ('–' when there is none)."""
    return "–" if value is None else f"{value:.{digits}f}"
