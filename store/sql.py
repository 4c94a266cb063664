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

import re
import threading
import weakref
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa

from trajlake.schemas.tables import CURRENT_LABELS_SQL
from trajlake.store.errors import ReadOnlyQueryError
from trajlake.store.reads import Params, TableSource, Within, connection, files_within, register_tables, tune
from trajlake.store.reads import placeholders as placeholders  # the SQL helper callers import from here
from trajlake.store.tables import TABLES

# imported here, not in `detokenize`: DuckDB runs it on its own threads (the module is light)
from trajlake.store.tokenizer import TokenizerNotFound, find_decoder

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


INTERNAL_SCHEMA = "trajlake_internal"
"""The schema of a query engine's internal relations: the stored tables (`_t_<table>`) and the
token views the `trajectories` and `turns` views join. On every cursor's search path, so queries
name `_t_<table>` as they would in `main`; `SHOW TABLES` lists `main` alone: the lake's tables."""

SCALAR_SCHEMA = "trajlake_internal_scalar"
DERIVED_VIEWS = {"current_labels": CURRENT_LABELS_SQL.format(table="_t_labels")}
"""Views over the tables that users query by name besides them (`show tables` lists them too)."""
"""The schema of the token-free `trajectories` and `turns` views (see `QueryEngine.sql`)."""

SEARCH_PATH = f"main,{INTERNAL_SCHEMA}"
SCALAR_SEARCH_PATH = f"{SCALAR_SCHEMA},{SEARCH_PATH}"


def lists_tables(query: str) -> bool:
    """Whether `query` is `SHOW TABLES`, which DuckDB answers from every schema on the search path."""
    try:
        words = [query[start:].split(None, 1)[0].lower() for start, _ in duckdb.tokenize(query)]
    except Exception:
        return False
    return [w.rstrip(";") for w in words if w != ";"] == ["show", "tables"]


def describes(query: str) -> bool:
    """Whether `query` is DESCRIBE, SHOW or SUMMARIZE: about the tables users see, token columns too."""
    try:
        first = duckdb.tokenize(query)[0][0]
    except Exception:
        return False
    return query[first:].split(None, 1)[0].lower() in ("describe", "show", "summarize")


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


def read_trajectory(lake: TableSource, trajectory_id: str, run_id: str | None = None) -> pa.Table:
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
            name: files_within(lake, name, "trajectory_id", trajectory_id, trajectory_id) for name in names
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

    def __init__(self, lake: TableSource) -> None:
        self.lake = lake
        self.tables = TABLES
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._datasets: dict[str, Any] = {}  # object-storage tables, registered on every cursor
        self._narrowed: dict[
            tuple[Any, ...], list[str] | None
        ] = {}  # (table, version, column, lo, hi) -> files
        self.con = duckdb.connect()
        tune(self.con)
        # Delta never rewrites a file in place, so a file's footer, once read, holds for the
        # engine's life: a point lookup on 355 files otherwise reads all 355 footers every time
        self.con.execute("set global parquet_metadata_cache = true")
        self.con.execute(f"create schema {INTERNAL_SCHEMA}; create schema {SCALAR_SCHEMA}")
        self.con.execute(f"set search_path = '{SEARCH_PATH}'")  # the views bind their relations there
        self._refresh(force=True)
        views = [
            f"create or replace view {INTERNAL_SCHEMA}._trajectory_tokens as " + TRAJECTORY_TOKENS_SQL,
            f"create or replace view {INTERNAL_SCHEMA}._turn_tokens as " + TURN_TOKENS_SQL,
            *(
                f"create or replace view main.{n} as {VIEWS.get(n, f'select * from _t_{n}')}"
                for n in self.tables
            ),
            *(f"create view {SCALAR_SCHEMA}.{n} as select * from _t_{n}" for n in VIEWS),
            *(f"create or replace view main.{n} as {sql}" for n, sql in DERIVED_VIEWS.items()),
        ]
        self.con.execute(";\n".join(views))
        self.token_columns = _token_columns(self.con)
        # null_handling as a string: its enum moved (duckdb.functional → duckdb.func) across versions
        self.con.create_function(  # type: ignore[call-overload]
            "detokenize", _detokenize(self), ["BIGINT[]", "VARCHAR"], "VARCHAR", null_handling="special"
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
            register_tables(self.con, self.lake, stale, self._datasets, schema=INTERNAL_SCHEMA)
            self._versions.update(current)

    def cursor(self, tokens: bool = True, search_path: str | None = None) -> duckdb.DuckDBPyConnection:
        """A connection for one thread, over up-to-date views; without `tokens`, `trajectories`
        and `turns` are their stored scalar columns alone (no join with `events`)."""
        with self._lock:
            self._refresh()
            cur = self.con.cursor()
            for name, dataset in self._datasets.items():
                cur.register(name, dataset)
        cur.execute(f"set search_path = '{search_path or (SEARCH_PATH if tokens else SCALAR_SEARCH_PATH)}'")
        return cur

    def sql(self, query: str, params: Params = None, within: Within | None = None) -> pa.Table:
        """Run one read-only statement; raise `ReadOnlyQueryError` for anything that writes.

        A query that reads no token column (`names_tokens`) runs on the token-free views. With
        `within` (`column, lo, hi`), each table the query names reads only its files whose Delta
        statistics may hold a `column` value in [lo, hi] (`Lake.files_within`): the query must
        itself keep to that range, as a dashboard query of one run does with `run_id`.
        """
        check_read_only(query)
        if lists_tables(query):  # DuckDB lists each schema on the search path: the lake's are main's
            cur = self.cursor(search_path="main")
        else:  # DESCRIBE and SUMMARIZE show a table as users see it, with its token columns
            cur = self.cursor(tokens=describes(query) or names_tokens(query, self.token_columns))
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
                some = files_within(self.lake, name, column, lo, hi)
                self._narrowed[key] = some if len(some) < self.lake.file_stats(name).num_rows else None
            narrowed = self._narrowed[key]
            if narrowed is not None:
                files[name] = narrowed
        if files:
            register_tables(cur, self.lake, list(files), temp=True, files=files)

    def close(self) -> None:
        self.con.close()


def _detokenize(engine: QueryEngine) -> Callable[[list[int] | None, str | None], str | None]:
    """SQL's `detokenize(token_ids, model)` on `engine`'s connection: the text of the ids (null for
    null ids), with the engine's `tokenizer` when set.

    It holds the engine weakly. DuckDB keeps the function where Python's collector cannot see it,
    so a strong reference would close a cycle (engine, connection, function) that nothing frees:
    every engine not closed kept its database and its threads for the process's life (2,000
    threads by the middle of the test suite)."""
    held = weakref.ref(engine)

    def detokenize(token_ids: list[int] | None, model: str | None) -> str | None:
        if token_ids is None:
            return None
        return find_decoder(model, getattr(held(), "tokenizer", None))(token_ids)

    return detokenize


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
