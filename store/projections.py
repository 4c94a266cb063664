"""Projections: `trajectories`, `turns`, `tool_calls`, `policy_versions`, `batch_consumption` and
`rewards`, each a pure function of `events`.

Each projection table records, as a Delta `txn` action in the same commit as its rows, the
`events` version it reflects (app id `trajlake-projection`). `catch_up` advances them from
there using the files the Delta log says were added since, so a crash between committing
events and updating projections is repaired on the next run. Rows of trajectories seen for
the first time are appended; rows of trajectories that already have rows are recomputed
from all their events and merged, which makes every update idempotent.
"""

from __future__ import annotations

import functools
import glob
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trajlake.common.retry import retrying
from trajlake.schemas.events import TOKEN_FIELDS
from trajlake.schemas.fields import (
    FIELDS,
    REWARD,
    TOOL_CALL,
    TOOL_RESULT,
    TRAJECTORY_FINISHED,
    TRAJECTORY_STARTED,
    feeds_into,
)
from trajlake.schemas.tables import PROJECTION_TABLES, TABLE_SCHEMAS
from trajlake.store.errors import CommitConflict, ProjectorFenced, TxnFenced
from trajlake.store.files import cores, summarized
from trajlake.store.reads import connection
from trajlake.store.summaries import SUMMARY_COLUMNS, is_summarized
from trajlake.store.tables import SCHEMAS, conform

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

APP_ID = "trajlake-projection"

KEYS: dict[str, tuple[str, ...]] = {
    "trajectories": ("run_id", "trajectory_id"),
    "turns": ("run_id", "trajectory_id", "seq"),
    "tool_calls": ("run_id", "trajectory_id", "call_id"),
    "rewards": ("run_id", "trajectory_id", "seq"),
}

REVISED = frozenset({"trajectories", "tool_calls"})
"""The projections whose rows a trajectory's later events change (merged); the others only grow."""

_ANY = object()


def fed(
    table: str,
    refer: Callable[[str, str | None], list[str]] = lambda name, source: [name],
    source: object = _ANY,
) -> str:
    """The select list of the columns event fields feed into `table` (see `schemas/fields.py`).

    Args:
        table: the projection.
        refer: how to read field `name` that comes from event type `source` (e.g. `c.name`);
            several expressions are coalesced, in order.
        source: only the fields taken from this event type.
    """
    parts = []
    for field, feed in feeds_into(table):
        if source is not _ANY and feed.source != source:
            continue
        column = feed.column or field.name
        values = [feed.sql] if feed.sql else refer(field.name, feed.source)
        if feed.default is not None:
            values.append(feed.default)
        expr = values[0] if len(values) == 1 else f"coalesce({', '.join(values)})"
        parts.append(expr if expr.split(".")[-1] == column else f"{expr} as {column}")
    return ", ".join(parts)


def _call_or_result(name: str, source: str | None) -> list[str]:
    return {TOOL_CALL: [f"c.{name}"], TOOL_RESULT: [f"r.{name}"], None: [f"c.{name}", f"r.{name}"]}[source]


def _first(name: str, source: str | None) -> list[str]:
    return [f"arg_min({name}, seq)"]


def _last(name: str, source: str | None) -> list[str]:
    return [f"arg_max({name}, seq)"]


def _last_event(name: str, source: str | None) -> list[str]:
    """The field of the last event, null or not: a re-score that could not score leaves no valid reward,
    never the previous verifier's (`arg_max` would pass over its null)."""
    return [f"arg_max_null({name}, seq)"]


def _from_cte(name: str, source: str | None) -> list[str]:
    return [f"{_TRAJECTORY_CTES[source]}.{name}"]


_TRAJECTORY_CTES = {TRAJECTORY_STARTED: "s", REWARD: "r", TRAJECTORY_FINISHED: "f"}

TURNS_SQL = f"""
select run_id, trajectory_id, event_id, seq, n_input_tokens, n_output_tokens, n_loss_tokens, sum_logprob,
  output_repetition, event_time, {fed("turns")}
from e where event_type = 'turn'
"""

TOOL_CALLS_SQL = f"""
with c as (select * from e where event_type = 'tool_call'),
     r as (select * from e where event_type = 'tool_result')
select coalesce(c.run_id, r.run_id) as run_id, coalesce(c.trajectory_id, r.trajectory_id) as trajectory_id,
  r.event_id is not null as has_result, c.seq as call_seq, r.seq as result_seq,
  c.event_time as called_at, r.event_time as finished_at,
  {fed("tool_calls", _call_or_result)}
from c full outer join r on c.run_id = r.run_id and c.trajectory_id = r.trajectory_id and c.call_id = r.call_id
"""

TRAJECTORIES_SQL = f"""
with ids as (
  select run_id, trajectory_id from e
  where trajectory_id is not null and event_type in
    ('trajectory_started', 'turn', 'tool_call', 'tool_result', 'reward', 'trajectory_finished')
  group by all
),
s as (
  select run_id, trajectory_id, min(event_time) as started_at,
    {fed("trajectories", _first, TRAJECTORY_STARTED)}
  from e where event_type = 'trajectory_started' group by all
),
v as (
  select run_id, trajectory_id, policy_version, count(*) as n_turns, sum(n_output_tokens) as n_output_tokens,
    sum(case when turn_index = 0 then n_input_tokens else 0 end) as prompt_tokens,
    sum(case when turn_index > 0 then n_input_tokens else 0 end) as env_tokens,
    sum(sum_logprob) as sum_logprob, max(context_used_fraction) as context_peak_fraction,
    count(*) filter (where nudged) as n_nudges, count(*) filter (where tito_drift) as n_drift_turns,
    sum(latency_s) as generation_s, max(latency_s) as slowest_turn_s, count(latency_s) as n_timed_turns
  from e where event_type = 'turn' group by all
),
t as (
  select run_id, trajectory_id, sum(n_turns) as n_turns,
    -- a turn of unknown version (null) leaves the trajectory's versions unknown: never as fresh as its others
    case when count(*) filter (where policy_version is null) = 0 then min(policy_version) end as policy_version_min,
    case when count(*) filter (where policy_version is null) = 0 then max(policy_version) end as policy_version_max,
    sum(n_output_tokens) as assistant_tokens, sum(prompt_tokens) as prompt_tokens, sum(env_tokens) as env_tokens,
    sum(sum_logprob) as sum_logprob, max(context_peak_fraction) as context_peak_fraction,
    sum(n_nudges) as n_nudges, sum(n_drift_turns) as n_drift_turns,
    list(struct_pack(policy_version, n_turns, n_output_tokens, sum_logprob) order by policy_version)
      as turns_by_version,
    sum(generation_s) as generation_s, max(slowest_turn_s) as slowest_turn_s, sum(n_timed_turns) as n_timed_turns
  from v group by all
),
tc as (
  select run_id, trajectory_id, count(*) as n_tool_calls,
    count(*) filter (where has_result and not ok) as n_tool_errors,
    count(*) filter (where timed_out) as n_tool_timeouts,
    count(*) filter (where truncated) as n_tool_truncated,
    sum(retries) as n_tool_retries,
    count(*) filter (where is_code_execution) as n_code_exec
  from tool_calls_rows group by all
),
r as (
  select run_id, trajectory_id, {fed("trajectories", _last_event, REWARD)}
  from e where event_type = 'reward' group by all
),
f as (
  select run_id, trajectory_id, max(event_time) as finished_at,
    {fed("trajectories", _last, TRAJECTORY_FINISHED)}
  from e where event_type = 'trajectory_finished' group by all
)
select ids.run_id, ids.trajectory_id, {fed("trajectories", _from_cte)},
  t.policy_version_min, t.policy_version_max, f.status is not null as finished,
  coalesce(t.n_turns, 0) as n_turns, coalesce(tc.n_tool_calls, 0) as n_tool_calls,
  coalesce(tc.n_tool_errors, 0) as n_tool_errors, coalesce(tc.n_tool_timeouts, 0) as n_tool_timeouts,
  coalesce(tc.n_tool_truncated, 0) as n_tool_truncated, coalesce(tc.n_tool_retries, 0) as n_tool_retries,
  coalesce(tc.n_code_exec, 0) as n_code_exec,
  coalesce(t.assistant_tokens, 0) as assistant_tokens, coalesce(t.env_tokens, 0) as env_tokens,
  coalesce(t.prompt_tokens + t.assistant_tokens + t.env_tokens, 0) as total_tokens,
  coalesce(t.sum_logprob, 0) as sum_logprob, t.context_peak_fraction,
  coalesce(t.n_nudges, 0) > 0 as nudged, coalesce(t.n_nudges, 0) as n_nudges,
  coalesce(t.n_drift_turns, 0) > 0 as tito_drift, coalesce(t.n_drift_turns, 0) as n_drift_turns,
  s.started_at, f.finished_at, t.turns_by_version,
  t.generation_s, t.slowest_turn_s, coalesce(t.n_timed_turns, 0) as n_timed_turns
from ids
left join s using (run_id, trajectory_id) left join t using (run_id, trajectory_id)
left join tc using (run_id, trajectory_id) left join r using (run_id, trajectory_id)
left join f using (run_id, trajectory_id)
"""

POLICY_VERSIONS_SQL = f"""
select run_id, event_time, {fed("policy_versions")}
from e where event_type = 'policy_updated'
"""

BATCH_CONSUMPTION_SQL = f"""
select run_id, event_time, {fed("batch_consumption")}
from e where event_type = 'batch_consumed'
"""

REWARDS_SQL = f"""
select run_id, trajectory_id, seq, event_time, {fed("rewards")}
from e where event_type = 'reward'
"""

SCALAR_COLUMNS = tuple(f.name for f in FIELDS if (f.projected or f.feeds) and not f.tokens)
STORED_COLUMNS = SCALAR_COLUMNS + SUMMARY_COLUMNS
"""The `events` columns projections read: no token payload, only its summary."""
EVENT_COLUMNS = SCALAR_COLUMNS + TOKEN_FIELDS
"""What they read of an `events` file older than the token summary, to summarize it."""


def scalarize(events: pa.Table) -> pa.Table:
    """The columns projections read: the events' scalars and their token summary (computed,
    on a thread per core, for events read from a file older than the summary)."""
    return summarized(events).select(list(STORED_COLUMNS))


def compute(
    events: pa.Table | None,
    con: duckdb.DuckDBPyConnection | None = None,
    names: Iterable[str] = PROJECTION_TABLES,
) -> dict[str, pa.Table]:
    """The rows of projections `names` (all by default) derived from `events` (which must hold
    whole trajectories).

    With `events=None`, `con` must already have a view `e` over the events to project.
    """
    names = set(names)
    own = con is None
    con = con or connection()
    try:
        if events is not None:
            con.register("e", events)
        out: dict[str, pa.Table] = {}
        if "turns" in names:
            out["turns"] = con.sql(TURNS_SQL).to_arrow_table()
        if names & {"tool_calls", "trajectories"}:  # a trajectory counts its tool calls
            out["tool_calls"] = con.sql(TOOL_CALLS_SQL).to_arrow_table()
        if "trajectories" in names:
            con.register("tool_calls_rows", out["tool_calls"])
            out["trajectories"] = con.sql(TRAJECTORIES_SQL).to_arrow_table()
            con.unregister("tool_calls_rows")
        if "policy_versions" in names:
            out["policy_versions"] = con.sql(POLICY_VERSIONS_SQL).to_arrow_table()
        if "batch_consumption" in names:
            out["batch_consumption"] = con.sql(BATCH_CONSUMPTION_SQL).to_arrow_table()
        if "rewards" in names:
            out["rewards"] = con.sql(REWARDS_SQL).to_arrow_table()
        if events is not None:
            con.unregister("e")
        return {name: _sorted(name, _conform(name, table)) for name, table in out.items() if name in names}
    finally:
        if own:
            con.close()


def _conform(name: str, table: pa.Table) -> pa.Table:
    schema = TABLE_SCHEMAS[name]
    return table.select(schema.names).cast(schema)


def _sorted(name: str, table: pa.Table) -> pa.Table:
    keys = KEYS.get(name) or (
        ("run_id", "step", "trajectory_id") if name == "batch_consumption" else ("run_id", "policy_version")
    )
    return table.sort_by([(k, "ascending") for k in keys])


def added_files(lake: Lake, after: int, upto: int) -> list[str] | None:
    """Paths of data files added to `events` by commits after..upto; None if the log is gone."""
    return lake.log.added_files("events", after, upto)


def _scalars(read: Callable[[list[str]], pa.Table]) -> pa.Table:
    """`scalarize(read(columns))`, reading the token lists only when some rows lack their summary
    (they come from a file written before it existed)."""
    stored = read(list(STORED_COLUMNS))
    return scalarize(stored if is_summarized(stored) else read(list(EVENT_COLUMNS)))


def _read_events_file(path: str, fs: pafs.FileSystem) -> pa.Table:
    """The columns projections read of one `events` file; a column newer than the file reads as null."""
    return _scalars(
        lambda columns: pq.read_table(path, columns=columns, filesystem=fs, schema=SCHEMAS["events"])
    )


def _events_row_groups(path: str, fs: pafs.FileSystem) -> Iterator[pa.Table]:
    """`_read_events_file`, a row group at a time: what bounds rebuild's memory by the row group,
    not the file. pyarrow's dataset scanner, even without read-ahead, held up to 0.6 GB of a
    merged 265 MB file's column chunks at once; a row group held 13 MB at 16k rows, 5.7 MB
    (uncompressed) at 8k."""
    with fs.open_input_file(path) as f:
        parquet = pq.ParquetFile(f)
        stored = set(parquet.schema_arrow.names)

        def read(i: int, columns: list[str]) -> pa.Table:  # a column newer than the file reads as null
            group = parquet.read_row_group(i, columns=[c for c in columns if c in stored])
            return conform(group, pa.schema([SCHEMAS["events"].field(c) for c in columns]))

        for i in range(parquet.num_row_groups):
            yield _scalars(functools.partial(read, i))


def _read_new_events(lake: Lake, paths: Iterable[str], known: Mapping[str, pa.Table]) -> pa.Table:
    fs, root = lake.filesystem()
    parts = []
    seen: set[int] = set()
    for path in paths:
        if path in known:  # several files of one write map to the one table they came from
            if id(known[path]) not in seen:
                seen.add(id(known[path]))
                parts.append(scalarize(known[path]))
        else:
            parts.append(_read_events_file(f"{root}/events/{path}", fs))
    if not parts:
        return scalarize(SCHEMAS["events"].empty_table())
    return pa.concat_tables(parts)


def catch_up(
    lake: Lake,
    known: Mapping[str, pa.Table] | None = None,
    fence: Mapping[str, int] | None = None,
    on_retry: Callable[[], None] | None = None,
) -> int:
    """Bring every projection up to the current `events` version; return that version.

    Args:
        lake: the lake.
        known: events files this process just wrote, by relative path, to skip reading them back.
        fence: `txn` app id -> version every projection commit expects (a projector's epoch);
            `ProjectorFenced` once one moved on.
        on_retry: called each time another writer moved a position and the catch-up starts over.
    """
    upto = lake.version("events")
    if upto < 0:
        return upto
    fence = dict(fence or {})

    def moved(err: BaseException) -> bool:
        if not isinstance(err, TxnFenced):
            return False
        if fence.keys() & err.stale.keys():
            raise ProjectorFenced(str(err), table_uri=err.table_uri) from None
        if on_retry is not None:
            on_retry()
        return True

    # a position moved: another writer advanced a projection meanwhile; start again from it
    try:
        for attempt in retrying(retry_on=moved, attempts=100):
            with attempt:
                _catch_up_once(lake, upto, known or {}, fence)
    except TxnFenced:
        raise CommitConflict(
            "projections kept losing races with other writers", table_uri=lake.uri("trajectories")
        ) from None
    return upto


def _catch_up_once(lake: Lake, upto: int, known: Mapping[str, pa.Table], fence: Mapping[str, int]) -> None:
    positions = {name: lake.txn_version(name, APP_ID) for name in PROJECTION_TABLES}
    for after in sorted({-1 if p is None else p for p in positions.values()}):
        if after >= upto:
            continue
        names = [n for n, p in positions.items() if (-1 if p is None else p) == after]
        paths = added_files(lake, after, upto)
        if paths is None:  # the log before `upto` was cleaned up: recompute from scratch
            rebuild(lake, names, fence)
            continue
        new = _read_new_events(lake, paths, known)
        _apply(lake, names, new, upto, None if after < 0 else after, fence)


def _apply(
    lake: Lake, names: list[str], new: pa.Table, upto: int, after: int | None, fence: Mapping[str, int]
) -> None:
    txn = {APP_ID: upto}
    expect = {APP_ID: after, **fence}  # only one writer may store a range, and only the projector holding it
    fresh_rows = compute(new)
    is_traj = pc.is_valid(new.column("trajectory_id"))
    ids = set(pc.filter(new.column("trajectory_id"), is_traj).to_pylist())
    starts = pc.and_(pc.equal(new.column("event_type"), "trajectory_started"), pc.equal(new.column("seq"), 0))
    fresh = set(pc.filter(new.column("trajectory_id"), starts).to_pylist())
    old = sorted(ids - fresh)
    old_rows: dict[str, pa.Table] = {}
    if old:
        # their earlier events: time-ordered ids keep a live run's in its last few files
        everything = _scalars(lambda columns: lake.read("events", columns, among=("trajectory_id", old)))
        old_rows = compute(everything, names=REVISED & set(names))

    def store(name: str) -> None:
        rows = fresh_rows[name]
        if name in REVISED and old:
            keep = pc.invert(pc.is_in(rows.column("trajectory_id"), pa.array(old)))
            rows = pa.concat_tables([rows.filter(keep), old_rows[name]])
            lake.upsert(name, rows, KEYS[name], txn, expect_txns=expect)
        else:  # turns, rewards and trainer projections: one row per event, never revised
            actions = [lake.write_file(name, rows)] if rows.num_rows else []
            lake.commit(name, actions, txn, expect_txns=expect)

    # each table is its own Delta transaction with its own position, so they are written and
    # committed side by side (pyarrow and delta-rs release the GIL); one that is fenced raises
    # here, and the next attempt skips the tables that committed
    with ThreadPoolExecutor(min(len(names), cores())) as pool:
        list(pool.map(store, names))


REBUILD_BUCKET_EVENTS = 1_000_000
"""About how many events `rebuild` projects at once: what bounds its memory on a lake of any size."""


def rebuild(
    lake: Lake, names: Iterable[str] = PROJECTION_TABLES, fence: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Recreate projections from all of `events`; return rows per table.

    Memory stays bounded however large the lake is. Each events file is read once, a row group
    at a time, and reduced to scalars, which are spilled to a temporary directory split by
    trajectory into buckets of about REBUILD_BUCKET_EVENTS events; each bucket's rows are
    projected and written on their own (a trajectory's events all fall in one bucket), and one
    commit per table then replaces its rows.
    """
    names = list(names)
    upto = lake.version("events")
    fs, _ = lake.filesystem()
    files = [uri.split("://", 1)[1] if "://" in uri else uri for uri in lake.files("events")]
    n_events = _stored_rows(lake, "events")
    buckets = max(1, -(-n_events // REBUILD_BUCKET_EVENTS))
    adds: dict[str, list] = {name: [] for name in names}
    counts = dict.fromkeys(names, 0)
    con = connection()
    try:
        with tempfile.TemporaryDirectory(prefix="trajlake-rebuild-") as spill:
            groups = (group for path in files for group in _events_row_groups(path, fs))
            for i, group in enumerate(groups):
                con.register("part", group)
                con.execute(
                    f"copy (select *, hash(coalesce(trajectory_id, '')) % {buckets} as bucket from part) "
                    f"to '{spill}/{i}' (format parquet, partition_by (bucket))"
                )
                con.unregister("part")
            empty = scalarize(SCHEMAS["events"].empty_table())
            for bucket in range(buckets):
                parts = sorted(glob.glob(f"{spill}/*/bucket={bucket}/*.parquet"))
                query = "select * from read_parquet($parts, hive_partitioning = false)"
                events = con.sql(query, params={"parts": parts}).to_arrow_table() if parts else empty
                rows = compute(events)
                for name in names:
                    adds[name] += lake.write_files(name, rows[name]) if rows[name].num_rows else []
                    counts[name] += rows[name].num_rows
                # before the next bucket loads: a bucket's events and rows held while the next
                # one's events are read raised the peak RSS by about 0.4 GB at 1M events a bucket
                del events, rows
    finally:
        con.close()
    for name in names:
        lake.commit(name, adds[name], {APP_ID: max(upto, -1)}, mode="overwrite", expect_txns=fence or None)
    return counts


def _stored_rows(lake: Lake, name: str) -> int:
    """Rows of `name`'s current files, from the Delta log's statistics."""
    actions = lake.file_stats(name)
    return int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0
