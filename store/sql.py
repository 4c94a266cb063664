"""Read-only SQL over the lake with DuckDB.

Every table is a view over the Parquet files of its current Delta snapshot. The
`trajectories` and `turns` views add their token columns from `events`, where token
payloads are stored once. DuckDB drops that join when a query does not use them only if the
query filters no join key either (`where run_id = …` keeps it: 3 s instead of 0.06 s on a
run of 2.9M turns). So a query that names no token column and expands no `*` runs against
views of the stored scalar columns alone (schema `_scalar`, first on its search path).
Queries are read-only: only SELECT-like statements run, and the connection can read no
file outside the lake and reach no network.

`detokenize(token_ids, model)` turns a token-id list into text with the tokenizer of `model`
(the `model` column a run recorded, or a tokenizer directory); `QueryEngine.tokenizer` (the
`--tokenizer DIR` of `trajlake sql`) overrides it.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from trajlake.store.errors import ReadOnlyQueryError

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

ALLOWED_STATEMENTS = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}

TRAJECTORY_TOKENS_SQL = """
select run_id, trajectory_id,
  flatten(list(list_concat(coalesce(input_token_ids, []::int[]), output_token_ids) order by seq)) as token_ids,
  flatten(list(list_concat(list_transform(coalesce(input_token_ids, []::int[]), lambda x: 0::float),
                           output_logprobs) order by seq)) as logprobs,
  flatten(list(list_concat(list_transform(coalesce(input_token_ids, []::int[]), lambda x: false),
                           coalesce(loss_mask, list_transform(output_token_ids, lambda x: true))) order by seq)) as loss_mask
from (
  select *, max(case when input_is_full then seq end) over (partition by run_id, trajectory_id) as restart_seq
  from _t_events where event_type = 'turn'
)
where restart_seq is null or seq >= restart_seq
group by run_id, trajectory_id
"""
"""The whole token sequence of each trajectory: prompt, outputs and appended input, in order.

A turn whose input broke the prefix invariant (TITO drift) stored its full input; the
sequence then restarts there, as the context the engine actually saw."""

TURN_TOKENS_SQL = """
select run_id, trajectory_id, seq, any_value(input_token_ids) as input_token_ids,
  any_value(output_token_ids) as output_token_ids, any_value(output_logprobs) as output_logprobs,
  any_value(loss_mask) as loss_mask
from _t_events group by run_id, trajectory_id, seq
"""
"""Token lists per turn. (run_id, trajectory_id, seq) is unique per event; grouping on it
without a filter lets DuckDB drop the join when no token column is selected."""

VIEWS = {
    "trajectories": """
        select t.*, k.token_ids, k.logprobs, k.loss_mask
        from _t_trajectories t
        left join _trajectory_tokens k on k.run_id = t.run_id and k.trajectory_id = t.trajectory_id
    """,
    "turns": """
        select t.*, k.input_token_ids, k.output_token_ids, k.output_logprobs, k.loss_mask
        from _t_turns t left join _turn_tokens k
          on k.run_id = t.run_id and k.trajectory_id = t.trajectory_id and k.seq = t.seq
    """,
}


SCALAR_SCHEMA = "_scalar"
"""The schema of the token-free `trajectories` and `turns` views (see `QueryEngine.sql`)."""


def names_tokens(query: str, token_columns: frozenset[str]) -> bool:
    """Whether `query` may read a token column: it names one, uses `COLUMNS(…)`, or has a `*`
    other than `count(*)` and a multiplication.

    Read from DuckDB's own tokenizer, so a name inside a string or a comment does not count. In
    doubt (the query does not tokenize), True.
    """
    try:
        tokens = duckdb.tokenize(query)
    except Exception:
        return True
    ends = [start for start, _ in tokens[1:]] + [len(query)]
    texts = [query[start:end].strip() for (start, _), end in zip(tokens, ends, strict=True)]
    operands = (duckdb.token_type.identifier, duckdb.token_type.numeric_const)
    for i, ((_, kind), text) in enumerate(zip(tokens, texts, strict=True)):
        if text.strip('"').lower() in token_columns | {"columns"}:
            return True
        if kind == duckdb.token_type.operator and text == "*":
            multiplies = i > 0 and (tokens[i - 1][1] in operands or texts[i - 1] == ")")
            after = texts[i + 1] if i + 1 < len(texts) else ""
            counts = [t.lower() for t in texts[max(i - 2, 0) : i]] == ["count", "("] and after == ")"
            if not (multiplies or counts):
                return True
    return False


Params = Sequence[Any] | Mapping[str, Any] | None
"""DuckDB parameters: values for `?` placeholders in order, or for `$name` placeholders by name."""

Within = tuple[str, Any, Any]
"""(column, lo, hi): read only the files whose Delta statistics may hold a `column` value in [lo, hi]."""


def placeholders(n: int) -> str:
    """`?, ?, ?` for an `IN (...)` list of `n` values passed as parameters."""
    return ", ".join("?" * n)


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
            _shared.execute("set threads to 2")
        return _shared.cursor()


def register_tables(
    con: duckdb.DuckDBPyConnection,
    lake: Lake,
    names: Sequence[str],
    datasets: dict[str, Any] | None = None,
    temp: bool = False,
    files: Mapping[str, Sequence[str]] | None = None,
    filename: bool = False,
) -> None:
    """(Re)create a raw `_t_<name>` view per table over its current files.

    On object storage the files are read through a pyarrow dataset registered as `_d_<name>`;
    registered objects belong to one connection, so they are also kept in `datasets` for
    cursors to register again. With `temp`, the views are the connection's own (a
    `connection()` shares its database with others); without, its cursors see them. `files`
    narrows a table's view to some of its current files (`Lake.files_within`). With `filename`,
    a local table's view ends with DuckDB's `filename` column: the file each row is from.
    """
    view = "temp view" if temp else "view"
    statements = []  # run as one script: DuckDB takes 8 views in one call in 2/3 of the time of 8 calls
    for name in names:
        files_of = list(files[name]) if files and name in files else lake.files(name)
        if not lake.is_local and files_of:
            import pyarrow.dataset as ds

            fs, _ = lake.filesystem()
            paths = [f.split("://", 1)[1] for f in files_of]
            from trajlake.store.lake import SCHEMAS

            # the full schema: files older than a column read it as null
            dataset = ds.dataset(paths, filesystem=fs, format="parquet", schema=SCHEMAS[name])
            con.register(f"_d_{name}", dataset)
            if datasets is not None:
                datasets[f"_d_{name}"] = dataset
            source = f"select * from _d_{name}"
        elif files_of:
            source = _select_files(con, lake, name, files_of, temp, filename)
        else:
            source = _no_rows(name)
        statements.append(f"create or replace {view} _t_{name} as {source}")
    if statements:
        con.execute(";\n".join(statements))


@functools.cache
def _no_rows(name: str) -> str:
    """A query of no rows with the columns of table `name`, typed as DuckDB reads its Arrow schema.

    Plain SQL, so a view over it costs no Arrow table copied into each engine's database (3-5 ms
    a table when an engine opens on a lake that has not written it yet).
    """
    from trajlake.store.lake import SCHEMAS

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
    lake: Lake,
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
    from trajlake.store.lake import SCHEMAS

    schema = SCHEMAS[name]
    stored = set(lake.stored_columns(name))
    mixed = lake.may_mix_schemas(name)
    options = (", union_by_name = true" if mixed else "") + (", filename = true" if filename else "")
    source = f"read_parquet({_file_list(files)}{options})"
    missing = [f for f in schema if f.name not in stored]
    if not missing and not mixed:
        return f"select * from {source}"
    if missing:  # one row of typed nulls, joined on: a cast for every Arrow type, done by DuckDB
        _arrow_table(con, f"_nulls_{name}", pa.table({f.name: pa.nulls(1, f.type) for f in missing}), temp)
        source += f", _nulls_{name}"
    columns = [*schema.names, *(["filename"] if filename else [])]
    return "select " + ", ".join(f'"{c}"' for c in columns) + f" from {source}"


def read_files(
    lake: Lake,
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
    lake: Lake, name: str, where: str | None, params: Params, uris: list[str], select: str
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


def read_trajectory(lake: Lake, trajectory_id: str, run_id: str | None = None) -> pa.Table:
    """One trajectory as the `trajectories` view gives it (its scalars, `token_ids`, `logprobs`,
    `loss_mask`), read from only the files whose Delta statistics may hold its id.

    The point lookup that stays flat as a run piles up files: the view itself checks every
    file's footer. Zero rows if the id is not in the lake; one per run that has it, unless
    `run_id` is given.

    The footers it reads stay in DuckDB's Parquet metadata cache, set for this cursor only so
    that the sink's projection reads, which never read a file twice, do not fill it: parsing the
    footer of a merged events file (66 row groups, 380 KB) was 20 ms of a 24 ms read.
    """
    con = connection()
    try:
        con.execute("set parquet_metadata_cache = true")
        names = ("trajectories", "events")
        files = {
            name: lake.files_within(name, "trajectory_id", trajectory_id, trajectory_id) for name in names
        }
        register_tables(con, lake, names, temp=True, files=files)
        con.execute("create or replace temp view _trajectory_tokens as " + TRAJECTORY_TOKENS_SQL)
        where, params = "trajectory_id = $id", {"id": trajectory_id}
        if run_id is not None:
            where, params = where + " and run_id = $run", params | {"run": run_id}
        return con.sql(
            f"select * from ({VIEWS['trajectories']}) where {where}", params=params
        ).to_arrow_table()
    finally:
        con.close()


class QueryEngine:
    """A read-only DuckDB database whose views follow the lake's Delta versions."""

    tokenizer: str | None = None
    """A tokenizer directory that `detokenize()` uses whatever model a row names."""

    def __init__(self, lake: Lake) -> None:
        from trajlake.store.lake import TABLES

        self.lake = lake
        self.tables = TABLES
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._datasets: dict[str, Any] = {}  # object-storage tables, registered on every cursor
        self._narrowed: dict[
            tuple[Any, ...], list[str] | None
        ] = {}  # (table, version, column, lo, hi) -> files
        self.con = duckdb.connect()
        self.con.execute("set threads to 2")
        # Delta never rewrites a file in place, so a file's footer, once read, holds for the
        # engine's life: a point lookup on 355 files otherwise reads all 355 footers every time
        self.con.execute("set global parquet_metadata_cache = true")
        self._refresh(force=True)
        views = [
            "create or replace view _trajectory_tokens as " + TRAJECTORY_TOKENS_SQL,
            "create or replace view _turn_tokens as " + TURN_TOKENS_SQL,
            *(f"create or replace view {n} as {VIEWS.get(n, f'select * from _t_{n}')}" for n in self.tables),
            f"create schema {SCALAR_SCHEMA}",
            *(f"create view {SCALAR_SCHEMA}.{n} as select * from main._t_{n}" for n in VIEWS),
        ]
        self.con.execute(";\n".join(views))
        self.token_columns = _token_columns(self.con)
        # null_handling as a string: its enum moved (duckdb.functional → duckdb.func) across versions
        self.con.create_function(  # type: ignore[call-overload]
            "detokenize", self.detokenize, ["BIGINT[]", "VARCHAR"], "VARCHAR", null_handling="special"
        )
        if lake.is_local:
            root = lake.root.rstrip("/") + "/"
            self.con.execute("set allowed_directories = ?", [[root]])
        self.con.execute("set enable_external_access = false")
        self.con.execute("set lock_configuration = true")

    def _refresh(self, force: bool = False) -> None:
        current = {name: self.lake.version(name) for name in self.tables}
        stale = [n for n in self.tables if force or current[n] != self._versions.get(n)]
        if stale:
            register_tables(self.con, self.lake, stale, self._datasets)
            self._versions.update(current)

    def cursor(self, tokens: bool = True) -> duckdb.DuckDBPyConnection:
        """A connection for one thread, over up-to-date views; without `tokens`, `trajectories`
        and `turns` are their stored scalar columns alone (no join with `events`)."""
        with self._lock:
            self._refresh()
            cur = self.con.cursor()
            for name, dataset in self._datasets.items():
                cur.register(name, dataset)
        if not tokens:
            cur.execute(f"set search_path = '{SCALAR_SCHEMA},main'")
        return cur

    def sql(self, query: str, params: Params = None, within: Within | None = None) -> pa.Table:
        """Run one read-only statement; raise `ReadOnlyQueryError` for anything that writes.

        A query that reads no token column (`names_tokens`) runs on the token-free views. With
        `within` (`column, lo, hi`), each table the query names reads only its files whose Delta
        statistics may hold a `column` value in [lo, hi] (`Lake.files_within`): the query must
        itself keep to that range, as a dashboard query of one run does with `run_id`.
        """
        check_read_only(query)
        cur = self.cursor(tokens=names_tokens(query, self.token_columns))
        try:
            if within is not None:
                self._narrow(cur, query, within)
            try:
                return cur.sql(query, params=params).to_arrow_table()
            except duckdb.PermissionException as err:
                raise ReadOnlyQueryError(
                    f"{err}. trajlake sql reads only the lake's tables "
                    f"({', '.join(t for t in self.tables)}); files and URLs outside the lake are refused"
                ) from None
            except duckdb.InvalidInputException as err:
                _raise_udf_error(err)
                raise
        finally:
            cur.close()

    def _narrow(self, cur: duckdb.DuckDBPyConnection, query: str, within: Within) -> None:
        """Shadow, on this cursor, the `_t_<name>` view of each table `query` names with one over
        only the files that may hold a value in the range (`dead_letters` keeps every file: its
        rows may have no run)."""
        column, lo, hi = within
        names = [
            n
            for n in self.tables
            if n != "dead_letters" and (f"_t_{n}" in query or re.search(rf"\b{n}\b", query))
        ]
        files: dict[str, list[str]] = {}
        for name in names:
            key = (name, self._versions.get(name), column, lo, hi)
            if key not in self._narrowed:
                if len(self._narrowed) > 256:
                    self._narrowed.clear()
                some = self.lake.files_within(name, column, lo, hi)
                self._narrowed[key] = some if len(some) < self.lake.file_stats(name).num_rows else None
            narrowed = self._narrowed[key]
            if narrowed is not None:
                files[name] = narrowed
        if files:
            register_tables(cur, self.lake, list(files), temp=True, files=files)

    def detokenize(self, token_ids: list[int] | None, model: str | None) -> str | None:
        """SQL's `detokenize(token_ids, model)`: the text of the ids (null for null ids)."""
        if token_ids is None:
            return None
        from trajlake.store.tokenizer import find_decoder

        return find_decoder(model, self.tokenizer)(token_ids)

    def close(self) -> None:
        self.con.close()


_TOKEN_COLUMNS: frozenset[str] | None = None


def _token_columns(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """The columns the `trajectories` and `turns` views add to the stored ones (their token lists),
    read from `con`'s views once per process: they follow from the views' SQL alone."""
    global _TOKEN_COLUMNS
    if _TOKEN_COLUMNS is None:
        added: set[str] = set()
        for name in VIEWS:
            stored = {r[0] for r in con.execute(f"describe _t_{name}").fetchall()}
            added |= {r[0] for r in con.execute(f"describe {name}").fetchall()} - stored
        _TOKEN_COLUMNS = frozenset(added)
    return _TOKEN_COLUMNS


def _raise_udf_error(err: Exception) -> None:
    """Raise detokenize()'s own error (it says the fix) instead of DuckDB's wrapper around it."""
    from trajlake.store.tokenizer import TokenizerNotFound

    _, found, message = str(err).partition(f"{TokenizerNotFound.__name__}: ")
    if found:
        raise TokenizerNotFound(message.strip()) from None


def check_read_only(query: str) -> None:
    """Refuse anything but SELECT/WITH/EXPLAIN statements, naming the offending statement type."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.ParserException as err:
        raise ReadOnlyQueryError(f"could not parse the query: {err}") from None
    if not statements:
        raise ReadOnlyQueryError("the query is empty; pass a SELECT statement")
    if len(statements) > 1:
        raise ReadOnlyQueryError(f"pass one statement at a time (got {len(statements)})")
    kind = statements[0].type
    if kind not in ALLOWED_STATEMENTS:
        raise ReadOnlyQueryError(
            f"trajlake sql is read-only: {kind.name} statements are refused; "
            "use SELECT (or WITH … SELECT / EXPLAIN) over the lake's tables"
        )
