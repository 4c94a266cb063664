"""Reading a lake's stored tables: DuckDB over the Parquet files of a Delta snapshot, pruned to the
files whose statistics may hold what is asked for.

This is the trusted read path (projections, the sampler, `Lake.read`): its SQL is the caller's
own, values go in parameters. Users' queries run on `store/sql.py`'s read-only engine, which
builds its views with `register_tables` here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import ValidationError

from trajlake.common.settings import env_name, settings_error
from trajlake.schemas.errors import CliError
from trajlake.store.config import DuckDBSettings
from trajlake.store.delta_log import may_hold
from trajlake.store.tables import SCHEMAS

Params = Sequence[Any] | Mapping[str, Any] | None
"""DuckDB parameters: values for `?` placeholders in order, or for `$name` placeholders by name."""

Within = tuple[str, Any, Any]
"""(column, lo, hi): read only the files whose Delta statistics may hold a `column` value in [lo, hi]."""


class TableSource(Protocol):
    """What reading a lake's tables needs of it (a `Lake` is one)."""

    @property
    def is_local(self) -> bool: ...
    @property
    def root(self) -> str: ...
    def filesystem(self) -> tuple[pafs.FileSystem, str]: ...
    def version(self, name: str) -> int: ...
    def files(self, name: str) -> list[str]: ...
    def file_stats(self, name: str, within: Within | None = None) -> pa.Table: ...
    def stored_columns(self, name: str) -> list[str]: ...
    def may_mix_schemas(self, name: str) -> bool: ...


def placeholders(n: int) -> str:
    """`?, ?, ?` for an `IN (...)` list of `n` values passed as parameters."""
    return ", ".join("?" * n)


def files_within(lake: TableSource, name: str, column: str, lo: Any, hi: Any) -> list[str]:
    """Paths of the current files of `name` that may hold a `column` value in [lo, hi].

    Decided from the min/max statistics in the Delta log (a file without them is kept), so
    a point or range read opens only those files, not the footer of every file: time-ordered
    ids (UUIDv7) and event times put each value in one or two of a long run's files.
    """
    return lake.file_stats(name, (column, lo, hi)).column("uri").to_pylist()


def read(
    lake: TableSource,
    name: str,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    params: Params = None,
    within: Within | None = None,
    among: tuple[str, Sequence[Any]] | None = None,
    files: pa.Table | None = None,
    select: str | None = None,
    by_file: bool = False,
) -> pa.Table:
    """Rows of a stored table (no views), optionally projected and filtered with SQL (`Lake.read`
    says what each argument does)."""
    if among is not None:
        column, values = among
        if not values:
            return read_files(lake, name, columns, "false", None, [], select=select, by_file=by_file)
        if isinstance(params, Mapping) or within is not None:
            raise TypeError("read(among=...) takes positional params (`?`) and no `within`")
        lo, hi = min(values), max(values)
        where = (f"({where}) and " if where else "") + (
            f'"{column}" between ? and ? and "{column}" in ({placeholders(len(values))})'
        )
        params, within = [*(params or ()), lo, hi, *values], (column, lo, hi)
    if files is not None:
        uris = (files if within is None else may_hold(files, *within)).column("uri").to_pylist()
    else:
        uris = files_within(lake, name, *within) if within else None
    return read_files(lake, name, columns, where, params, uris, select=select, by_file=by_file)


def _file_list(paths: Sequence[str]) -> str:
    """A DuckDB list of file paths for view DDL, which DuckDB cannot take parameters in."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


_shared: duckdb.DuckDBPyConnection | None = None
_shared_lock = threading.Lock()


def connection() -> duckdb.DuckDBPyConnection:
    """A new DuckDB connection for the lake's own trusted work (projections, `Lake.read`).

    Opening a DuckDB database costs 20-250 ms (it starts its thread pool; the most on a busy
    machine), a connection to an open one microseconds, and projections run on every sink
    commit. So these are cursors on one in-memory database per process. Registered objects
    and temp views belong to one connection: callers do not see each other's. Close it when
    done.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = duckdb.connect()
            tune(_shared)
        return _shared.cursor()


def tune(con: duckdb.DuckDBPyConnection, settings: DuckDBSettings | None = None) -> None:
    """Set a new DuckDB database's threads and memory limit (`DuckDBSettings`, by default from the env)."""
    from trajlake.store.files import cores

    if settings is None:
        try:
            settings = DuckDBSettings.from_env()
        except ValidationError as err:
            where = {f: env_name(DuckDBSettings, f) for f in DuckDBSettings.model_fields}
            raise CliError(settings_error(err, where)) from None
    con.execute("set threads = ?", [settings.threads or cores()])
    if settings.memory_limit is not None:
        con.execute("set memory_limit = ?", [settings.memory_limit])


def register_tables(
    con: duckdb.DuckDBPyConnection,
    lake: TableSource,
    names: Sequence[str],
    datasets: dict[str, Any] | None = None,
    temp: bool = False,
    files: Mapping[str, Sequence[str]] | None = None,
    filename: bool = False,
    schema: str | None = None,
) -> None:
    """(Re)create a raw `_t_<name>` view per table over its current files.

    On object storage the files are read through a pyarrow dataset registered as `_d_<name>`;
    registered objects belong to one connection, so they are also kept in `datasets` for
    cursors to register again. With `temp`, the views are the connection's own (a
    `connection()` shares its database with others); without, its cursors see them. `files`
    narrows a table's view to some of its current files (`Lake.files_within`). With `filename`,
    a local table's view ends with DuckDB's `filename` column: the file each row is from. `schema`
    holds the views (default: the connection's current one).
    """
    view = "temp view" if temp else "view"
    prefix = f"{schema}." if schema else ""
    statements = []  # run as one script: DuckDB takes 8 views in one call in 2/3 of the time of 8 calls
    for name in names:
        files_of = list(files[name]) if files and name in files else lake.files(name)
        if not lake.is_local and files_of:
            import pyarrow.dataset as ds

            fs, _ = lake.filesystem()
            paths = [f.split("://", 1)[1] for f in files_of]
            # the full schema: files older than a column read it as null
            dataset = ds.dataset(paths, filesystem=fs, format="parquet", schema=_scan_schema(SCHEMAS[name]))
            con.register(f"_d_{name}", dataset)
            if datasets is not None:
                datasets[f"_d_{name}"] = dataset
            source = f"select * from _d_{name}"
        elif files_of:
            source = _select_files(con, lake, name, files_of, temp, filename)
        else:
            source = _no_rows(name)
        statements.append(f"create or replace {view} {prefix}_t_{name} as {source}")
    if statements:
        con.execute(";\n".join(statements))


@functools.cache
def _scan_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` with its string columns as `string_view`, the type DuckDB pushes its filters in: a
    dataset declared `string` fails them (pyarrow has no kernel comparing the two) on any file whose
    footer says `string_view`, as the files of delta-rs MERGE do (a projection's revised rows)."""
    return pa.schema([f.with_type(pa.string_view()) if f.type == pa.string() else f for f in schema])


@functools.cache
def _no_rows(name: str) -> str:
    """A query of no rows with the columns of table `name`, typed as DuckDB reads its Arrow schema.

    Plain SQL, so a view over it costs no Arrow table copied into each engine's database (3-5 ms
    a table when an engine opens on a lake that has not written it yet).
    """
    con = connection()
    try:
        con.register("_schema", SCHEMAS[name].empty_table())
        columns = con.execute("describe _schema").fetchall()
    finally:
        con.close()
    return "select " + ", ".join(f'null::{type_} as "{column}"' for column, type_, *_ in columns) + " limit 0"


def _arrow_table(con: duckdb.DuckDBPyConnection, name: str, data: pa.Table, temp: bool) -> None:
    """`data` as relation `name`: the connection's own, or a table its cursors see too.

    Cursors (QueryEngine.cursor) do not see Arrow objects registered on the parent connection,
    so for them it is copied into an in-memory table.
    """
    if temp:
        con.register(name, data)
        return
    con.execute(f"drop table if exists {name}")
    con.from_arrow(data).create(name)


def _select_files(
    con: duckdb.DuckDBPyConnection,
    lake: TableSource,
    name: str,
    files: Sequence[str],
    temp: bool,
    filename: bool = False,
) -> str:
    """A query over local Parquet files of `name` with every column of its schema (and the file
    of each row as `filename`, when asked).

    Columns the stored table lacks (a lake from before a field existed) read as null; once
    a table has gained columns, its files are read by column name, older ones without them.
    """
    schema = SCHEMAS[name]
    stored = set(lake.stored_columns(name))
    mixed = lake.may_mix_schemas(name)
    options = (", union_by_name = true" if mixed else "") + (", filename = true" if filename else "")
    source = f"read_parquet({_file_list(files)}{options})"
    if mixed:  # a column the table gained may be in no file yet: read by name, it is not in the union
        stored = set().union(*(_file_columns(f) for f in files))
    missing = [f for f in schema if f.name not in stored]
    if not missing and not mixed:
        return f"select * from {source}"
    if missing:  # one row of typed nulls, joined on: a cast for every Arrow type, done by DuckDB
        _arrow_table(con, f"_nulls_{name}", pa.table({f.name: pa.nulls(1, f.type) for f in missing}), temp)
        source += f", _nulls_{name}"
    columns = [*schema.names, *(["filename"] if filename else [])]
    return "select " + ", ".join(f'"{c}"' for c in columns) + f" from {source}"


@functools.lru_cache(maxsize=65_536)
def _file_columns(path: str) -> frozenset[str]:
    """The columns of one local Parquet file (its footer, read once: a data file never changes)."""
    import pyarrow.parquet as pq

    return frozenset(pq.read_schema(path.removeprefix("file://")).names)


def read_files(
    lake: TableSource,
    name: str,
    columns: Sequence[str] | None,
    where: str | None,
    params: Params = None,
    files: Sequence[str] | None = None,
    select: str | None = None,
    by_file: bool = False,
) -> pa.Table:
    """Internal read of one stored table, or of some of its `files` (trusted SQL: no read-only
    guard); values go in `params`. `select` replaces `columns` with SQL expressions; with
    `by_file`, its aggregates are taken per file, their `uri` first: a row per file with rows
    (a file without may have one too)."""
    if select is not None and columns is not None:
        raise TypeError("read_files takes columns or select, not both")
    if by_file:
        if select is None:
            raise TypeError("read_files(by_file=True) takes aggregates in `select`")
        files = list(files) if files is not None else lake.files(name)
        if not files or not lake.is_local:  # a dataset's rows do not tell their file
            return _aggregate_each_file(lake, name, where, params, files, select)
    con = connection()
    try:
        files_of = None if files is None else {name: files}
        register_tables(con, lake, [name], temp=True, files=files_of, filename=by_file)
        cols = select or (", ".join(f'"{c}"' for c in columns) if columns else "*")
        query = f"select {'filename as uri, ' if by_file else ''}{cols} from _t_{name}"
        query += (f" where {where}" if where else "") + (" group by filename" if by_file else "")
        return con.sql(query, params=params).to_arrow_table()
    finally:
        con.close()


def _aggregate_each_file(
    lake: TableSource, name: str, where: str | None, params: Params, uris: list[str], select: str
) -> pa.Table:
    """`read_files(by_file=True)` as one read of each file: an aggregate gives one row a file."""
    parts = [
        read_files(lake, name, None, where, params, [uri], select).add_column(0, "uri", pa.array([uri]))
        for uri in uris
    ]
    if not parts:
        empty = read_files(lake, name, None, "false", None, [], select).slice(0, 0)
        parts = [empty.add_column(0, "uri", pa.array([], pa.string()))]
    return pa.concat_tables(parts)
