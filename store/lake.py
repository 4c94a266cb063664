"""The lake: Delta tables under one root, written as Parquet we lay out ourselves.

`Lake` is the one object callers hold; each of its roles is a module of its own:
  * `store/storage.py`: the root (local or `s3://`), its options and filesystem;
  * `store/delta_log.py`: the tables' Delta logs (versions, `txn` positions, files, statistics);
  * `store/files.py`: writing data files (Parquet with zstd, byte-stream-split token lists);
  * `store/commits.py`: committing files and `txn` actions (source offsets, projection
    positions) in one Delta transaction, fenced on the positions a writer last saw;
  * `store/reads.py`: reading stored tables with DuckDB, pruned by the log's statistics;
  * `store/sql.py`: the read-only SQL engine over every table and view.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from trajlake.store import reads
from trajlake.store.commits import Committer
from trajlake.store.config import LakeConfig
from trajlake.store.delta_log import DeltaLog
from trajlake.store.errors import LakeNotFound
from trajlake.store.files import FileWriter
from trajlake.store.storage import Storage
from trajlake.store.tables import SCHEMAS, TABLES

__all__ = ["SCHEMAS", "TABLES", "Lake"]


class Lake:
    """All tables of one lake root (a local directory, or `s3://bucket/prefix`)."""

    def __init__(
        self,
        root: str | Path,
        config: LakeConfig | None = None,
        storage_options: Mapping[str, str] | None = None,
        *,
        create: bool = True,
    ) -> None:
        """The lake at `root`; `create=False` (a reader) raises `LakeNotFound` where it holds no table
        instead of making the directory."""
        self.config = config or LakeConfig()
        self.storage = Storage(root, storage_options)
        self.log = DeltaLog(self.storage, self.config)
        self.writer = FileWriter(self.storage, self.log, self.config)
        self.commits = Committer(self.log)
        self._lock = threading.Lock()
        self._sql: Any = None
        if not create:
            if not self.holds_tables():
                raise LakeNotFound(
                    f"no lake at {self.root} (none of a lake's tables is there)", root=self.root
                )
        else:
            self.storage.make_root()

    def __repr__(self) -> str:
        return f"Lake({self.root!r})"

    # -- where it lives, and its tables' logs ----------------------------------------------
    @property
    def root(self) -> str:
        """The lake root: an absolute local path, or `s3://bucket/prefix`."""
        return self.storage.root

    @property
    def is_local(self) -> bool:
        """True for a lake in a local directory."""
        return self.storage.is_local

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the lake root's path in it, reaching the storage delta-rs reaches."""
        return self.storage.filesystem()

    def uri(self, name: str) -> str:
        """The Delta table URI of `name`."""
        return self.log.uri(name)

    def holds_tables(self) -> bool:
        """True if any table of the lake has been created under the root (`events` asked first: a
        lake nearly always has it, so an object store answers one request)."""
        return any(self.exists(name) for name in TABLES)

    def exists(self, name: str) -> bool:
        """True if table `name` has been created."""
        return self.log.exists(name)

    def delta(self, name: str, create: bool = True) -> DeltaTable:
        """The up-to-date `DeltaTable` for `name`, created empty on first use."""
        return self.log.table(name, create)

    def version(self, name: str) -> int:
        """Current Delta version of `name` (-1 if it does not exist)."""
        return self.log.version(name)

    def txn_version(self, name: str, app_id: str) -> int | None:
        """The version stored by the last `txn` action of `app_id` in table `name`."""
        return self.log.txn_version(name, app_id)

    def stored_columns(self, name: str) -> list[str]:
        """The columns of table `name` as stored (a lake written by an older trajlake may lack some)."""
        return self.log.stored_columns(name)

    def may_mix_schemas(self, name: str) -> bool:
        """True once `name` gained columns after files were written: older files lack them."""
        return self.log.may_mix_schemas(name)

    def files(self, name: str) -> list[str]:
        """Paths of the Parquet files in the current snapshot of `name`."""
        return self.log.files(name)

    def file_stats(self, name: str, within: tuple[str, Any, Any] | None = None) -> pa.Table:
        """The current files of `name` with their Delta statistics (`DeltaLog.file_stats`)."""
        return self.log.file_stats(name, within)

    def files_within(self, name: str, column: str, lo: Any, hi: Any) -> list[str]:
        """Paths of the current files of `name` that may hold a `column` value in [lo, hi]."""
        return reads.files_within(self, name, column, lo, hi)

    # -- writes --------------------------------------------------------------------------
    def write_file(self, name: str, data: pa.Table) -> AddAction:
        """Write `data` as one new Parquet file of table `name` (not yet committed)."""
        return self.writer.write_file(name, data)

    def write_batches(self, name: str, batches: Iterable[pa.RecordBatch]) -> AddAction:
        """Write a stream of batches as one new Parquet file of `name` (not yet committed)."""
        return self.writer.write_batches(name, batches)

    def write_files(self, name: str, data: pa.Table) -> list[AddAction]:
        """Write `data` as a file per core, in parallel threads (not yet committed)."""
        return self.writer.write_files(name, data)

    def commit(
        self,
        name: str,
        actions: Sequence[AddAction],
        app_transactions: Mapping[str, int] | None = None,
        mode: str = "append",
        expect_txns: Mapping[str, int | None] | None = None,
    ) -> int:
        """Commit written files and `txn` actions in one Delta transaction, fenced on `expect_txns`
        (`Committer.commit`); return the version."""
        return self.commits.commit(name, actions, app_transactions, mode, expect_txns)

    def replace_files(self, name: str, added: Sequence[AddAction], removed: Sequence[RemoveAction]) -> int:
        """Commit `added` in place of `removed` (the same rows, rewritten); return the version."""
        return self.commits.replace_files(name, added, removed)

    def check_txns(self, name: str, expect_txns: Mapping[str, int | None]) -> DeltaTable:
        """The up-to-date table, after checking each app id still has the expected version."""
        return self.commits.check_txns(name, expect_txns)

    def append(self, name: str, data: pa.Table, app_transactions: Mapping[str, int] | None = None) -> int:
        """Append rows (possibly none) and `txn` actions atomically; return the new version."""
        actions = [self.write_file(name, data)] if data.num_rows else []
        return self.commit(name, actions, app_transactions)

    def overwrite(self, name: str, data: pa.Table, app_transactions: Mapping[str, int] | None = None) -> int:
        """Replace every row of `name` with `data` in one commit."""
        actions = [self.write_file(name, data)] if data.num_rows else []
        return self.commit(name, actions, app_transactions, mode="overwrite")

    def upsert(
        self,
        name: str,
        data: pa.Table,
        keys: Sequence[str],
        app_transactions: Mapping[str, int] | None = None,
        expect_txns: Mapping[str, int | None] | None = None,
    ) -> int:
        """Insert rows, replacing those with the same `keys`, in one Delta MERGE commit; `expect_txns`
        fences it as in `commit`."""
        if data.num_rows:
            return self.commits.upsert(name, data, keys, app_transactions, expect_txns)
        return self.commit(name, [], app_transactions, expect_txns=expect_txns)

    # -- reads ---------------------------------------------------------------------------
    def read(
        self,
        name: str,
        columns: Sequence[str] | None = None,
        where: str | None = None,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        within: tuple[str, Any, Any] | None = None,
        among: tuple[str, Sequence[Any]] | None = None,
        files: pa.Table | None = None,
        select: str | None = None,
        by_file: bool = False,
    ) -> pa.Table:
        """Rows of a stored table (no views), optionally projected and filtered with SQL.

        Args:
            name: the table.
            columns: columns to read (all if None).
            select: instead of `columns`, trusted SQL expressions over the rows (e.g. aggregates),
                so that a count of a million rows returns one row, not the million.
            where: a SQL condition; values go in `params` (`?` or `$name`), never into the text.
            params: DuckDB parameters of `where`.
            within: (column, lo, hi): read only the files that may hold a `column` value in
                [lo, hi] (`files_within`); `where` must still filter the rows.
            among: (column, values): only the rows whose `column` is one of `values`, read from
                the files and row groups whose statistics may hold their range (DuckDB prunes
                row groups on a range, not on an `IN` list of hundreds); `params` must be positional.
            files: a `file_stats(name)` table to read from instead of the table's current files,
                so that several reads see one snapshot; `within` or `among` keep those of its files
                that may hold their range.
            by_file: the aggregates of `select` per file, each row's file in a first column `uri`
                (a file without rows may have no row): one read of a local table's files, a read
                of each file on object storage.
        """
        return reads.read(self, name, columns, where, params, within, among, files, select, by_file)

    def trajectory(self, trajectory_id: str, run_id: str | None = None) -> pa.Table:
        """One trajectory with its token lists, from only the files that may hold it (`read_trajectory`)."""
        from trajlake.store.sql import read_trajectory

        return read_trajectory(self, trajectory_id, run_id)

    def sql(
        self,
        query: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        within: tuple[str, Any, Any] | None = None,
    ) -> pa.Table:
        """Run one read-only SQL query over every table, with DuckDB `params`; return Arrow.

        `within` (column, lo, hi): the tables the query names read only the files that may hold
        a `column` value in [lo, hi] (`files_within`); the query must keep to that range itself.
        """
        return self.query_engine().sql(query, params, within)

    def query_engine(self) -> Any:
        """The lake's shared read-only DuckDB engine (`trajlake.store.sql.QueryEngine`)."""
        with self._lock:
            if self._sql is None:
                from trajlake.store.sql import QueryEngine

                self._sql = QueryEngine(self)
            return self._sql

    def connect(self) -> Any:
        """A read-only DuckDB connection with every table registered as a view."""
        return self.query_engine().cursor()

    def close(self) -> None:
        """Release the DuckDB engine."""
        with self._lock:
            if self._sql is not None:
                self._sql.close()
                self._sql = None
