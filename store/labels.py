"""Labels on trajectories and turns: an append-only table, where the latest row per run, trajectory,
turn and key is the label's value (a null value clears it).

`trajlake label` and the trajectory browser write them; the sampler leaves labelled trajectories
out (`SamplerConfig.exclude_labels`), `trajlake doctor` and the failures page count them, and
`trajlake export` filters by them. A selection of labels is a list of specs, `KEY` (any value)
or `KEY=VALUE`; a label on one of a trajectory's turns marks the trajectory too.
"""

from __future__ import annotations

import datetime as dt
import getpass
import socket
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schemas.tables import CURRENT_LABELS_SQL, LABELS_SCHEMA
from trajlake.store.config import parse_label_specs
from trajlake.store.errors import LakeError
from trajlake.store.reads import connection

if TYPE_CHECKING:
    from trajlake.store.lake import Lake


class LabelError(LakeError):
    """A label that cannot be written or a selection that cannot be read as asked; the message says the fix."""


def default_author() -> str:
    """Who labels when no author is named: the user at this host."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def parse_specs(specs: Sequence[str]) -> list[tuple[str, str | None]]:
    """`KEY` or `KEY=VALUE` specs as (key, value or None for any value); a bad key is a `LabelError`."""
    try:
        return parse_label_specs(specs)
    except ValueError as err:
        raise LabelError(str(err)) from None


def label_rows(
    run_id: str,
    trajectory_ids: Sequence[str],
    key: str,
    value: str | None,
    author: str,
    turn_index: int | None = None,
) -> pa.Table:
    """One label row per trajectory (on turn `turn_index`, or the whole trajectory); value None clears it."""
    now = dt.datetime.now(dt.UTC)
    parse_specs([key])
    if not author:
        raise LabelError("a label needs an author; pass --author (who is labelling)")
    rows = [
        {"label_id": str(uuid.uuid4()), "run_id": run_id, "trajectory_id": tid, "turn_index": turn_index,
         "key": key, "value": value, "author": author, "created_at": now}
        for tid in trajectory_ids
    ]  # fmt: skip
    return pa.Table.from_pylist(rows, schema=LABELS_SCHEMA)


def add_labels(lake: Lake, rows: pa.Table) -> int:
    """Append label rows after checking each names a trajectory (and turn) of its run; return the version."""
    for run_id in set(rows.column("run_id").to_pylist()):
        mine = rows.filter(pc.equal(rows.column("run_id"), run_id))
        _check_targets(lake, run_id, mine)
    return lake.append("labels", rows)


def _check_targets(lake: Lake, run_id: str, rows: pa.Table) -> None:
    ids = sorted(set(rows.column("trajectory_id").to_pylist()))
    known = {}
    if lake.exists("trajectories"):
        found = lake.read("trajectories", ["trajectory_id", "n_turns"], "run_id = ?", [run_id],
                          among=("trajectory_id", ids))  # fmt: skip
        known = dict(zip(found.column(0).to_pylist(), found.column(1).to_pylist(), strict=True))
    missing = [t for t in ids if t not in known]
    if missing:
        raise LabelError(
            f"{len(missing)} of {len(ids)} trajectories are not in run {run_id!r} (e.g. {missing[0]}); "
            "check --run and the ids (trajlake sql \"select trajectory_id from trajectories where run_id = '...'\")"
        )
    for tid, turn in zip(rows.column("trajectory_id").to_pylist(), rows.column("turn_index").to_pylist(),
                         strict=True):  # fmt: skip
        if turn is not None and not 0 <= turn < (known[tid] or 0):
            raise LabelError(
                f"trajectory {tid} has {known[tid]} turns (0 to {known[tid] - 1}); turn {turn} is not one of them"
            )


def current_labels(lake: Lake, run_id: str) -> pa.Table:
    """The labels in force on run `run_id`'s trajectories and turns (`CURRENT_LABELS_SQL`)."""
    if not lake.exists("labels"):
        return LABELS_SCHEMA.empty_table()
    rows = lake.read("labels", where="run_id = ?", params=[run_id])
    con = connection()
    try:
        con.register("rows", rows)
        return con.sql(
            CURRENT_LABELS_SQL.format(table="rows") + " order by created_at, label_id"
        ).to_arrow_table()
    finally:
        con.close()


def matches(labels: pa.Table, specs: Sequence[tuple[str, str | None]]) -> pa.Table:
    """The rows of `labels` that one of `specs` (`parse_specs`) selects."""
    keys, values = labels.column("key").to_pylist(), labels.column("value").to_pylist()
    keep = [
        any(k == key and (v is None or v == value) for k, v in specs)
        for key, value in zip(keys, values, strict=True)
    ]
    return labels.filter(pa.array(keep, pa.bool_()))


def labelled_trajectories(lake: Lake, run_id: str, specs: Sequence[tuple[str, str | None]]) -> set[str]:
    """Ids of run `run_id`'s trajectories that carry (on themselves or a turn) a label `specs` selects."""
    if not specs:
        return set()
    return set(matches(current_labels(lake, run_id), specs).column("trajectory_id").to_pylist())


def label_counts(lake: Lake, run_id: str) -> list[dict[str, object]]:
    """Per label key in force on the run: the trajectories it marks (on themselves or a turn) and its turn labels."""
    labels = current_labels(lake, run_id)
    con = connection()
    try:
        con.register("labels", labels)
        return (
            con.sql(
                "select key, count(distinct trajectory_id) as trajectories, "
                "count(*) filter (where turn_index is not null) as turns from labels group by key "
                "order by trajectories desc, key"
            )
            .to_arrow_table()
            .to_pylist()
        )
    finally:
        con.close()
