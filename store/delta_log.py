"""The Delta log of a lake's tables: the one module that knows its internals.

It opens and follows each table's log (cheaply, where a local log lets a `stat` say there is
no new commit), answers a table's version, its `txn` positions and its files with their
statistics, lists the data files commits added after a version, evolves a stored schema, and
cleans up expired log entries now and then.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Field, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from trajlake.store.config import LakeConfig
from trajlake.store.errors import LakeError
from trajlake.store.put_if_absent import require_safe_store
from trajlake.store.storage import Storage, is_file
from trajlake.store.tables import SCHEMAS, TABLES, table_properties

log = logging.getLogger(__name__)

POST_COMMIT = PostCommitHookProperties(cleanup_expired_logs=False)
"""After a commit: a checkpoint at the table's interval, but no clean-up of expired log entries,
which delta-rs runs after every commit by listing the whole `_delta_log` and stat'ing each entry.
The log keeps every commit of `delta.logRetentionDuration` (`LakeConfig.log_retention_hours`), so
that cost grew with the run: at 1B tokens (1,100 entries) 10-14 ms of a 20 ms commit. `committed`
cleans up once every `LOG_CLEANUP_INTERVAL` versions instead."""
LOG_CLEANUP_INTERVAL = 100
"""Versions between clean-ups of a table's expired log entries (a list of its `_delta_log`)."""
EVOLVED_APP_ID = "trajlake-schema"
"""A `txn` app id in the commit that gave a table new columns: its files may lack some of them."""


class DeltaLog:
    """The Delta logs of every table under one lake root, each loaded once and followed."""

    def __init__(self, storage: Storage, config: LakeConfig) -> None:
        self.storage = storage
        self.config = config
        self._tables: dict[str, DeltaTable] = {}
        self._file_stats: dict[str, tuple[int, pa.Table]] = {}
        """name -> (version, `file_stats`)."""
        self._txns: dict[tuple[str, str], tuple[int, int | None]] = {}
        """(table, app id) -> (table version, its `txn` version there): `txn`'s cache."""
        self._evolved: set[str] = set()  # tables whose stored schema has every column of SCHEMAS
        self._lock = threading.RLock()

    def uri(self, name: str) -> str:
        """The Delta table URI of `name`."""
        if name not in SCHEMAS:
            raise LakeError(f"unknown table {name!r}; the lake has {', '.join(TABLES)}")
        return f"{self.storage.root}/{name}"

    def exists(self, name: str) -> bool:
        """True if table `name` has been created."""
        if name in self._tables:  # tables are never dropped: once opened, always there
            return True
        # an error is not "no table": the storage did not answer, so nothing can be said
        with self.storage.errors(self.uri(name)):
            if self.storage.is_local:
                # a table exists from its first commit (version 0, written put-if-absent) on, and
                # a log cleaned up since keeps a checkpoint: two stats, where delta-rs lists the
                # whole log (6 ms for 1,077 commits), and every reader asks for each table it opens
                log_dir = f"{self.uri(name)}/_delta_log"
                return is_file(f"{log_dir}/{0:020d}.json") or is_file(f"{log_dir}/_last_checkpoint")
            return DeltaTable.is_deltatable(self.uri(name), storage_options=self.storage.options or None)

    def table(self, name: str, create: bool = True) -> DeltaTable:
        """The up-to-date `DeltaTable` for `name`, created empty on first use."""
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                table = self._open(name, create)
                self._tables[name] = table
            else:
                self.catch_up(name, table)
            return table

    def snapshot(self, name: str) -> DeltaTable:
        """The table as last loaded (by `files`, `version`, …), without polling the log again."""
        with self._lock:
            return self._tables.get(name) or self.table(name)

    def catch_up(self, name: str, table: DeltaTable) -> None:
        """Load into `table` the commits written since its version.

        In a local lake a commit is the file `_delta_log/<version + 1>.json` appearing (Delta
        writes it put-if-absent), so a `stat` or two say whether there is any: 8 µs each where
        delta-rs lists the log in 0.3 ms, and a sink commit or a query engine checks every table.
        A log clean-up removes the commits before a checkpoint once they are older than the
        table's retention; a reader that old finds its own commit gone too, and loads from the
        checkpoint.
        """
        if self.storage.is_local:
            log_dir, version = f"{self.uri(name)}/_delta_log", table.version()
            if not is_file(f"{log_dir}/{version + 1:020d}.json") and is_file(
                f"{log_dir}/{version:020d}.json"
            ):
                return
        table.update_incremental()

    def committed(self, name: str, table: DeltaTable) -> int:
        """After this writer's commit to `name`: load it and any later commits, and now and then
        delete the log entries past retention (`POST_COMMIT`); return the version."""
        self.catch_up(name, table)
        version = table.version()
        if version % LOG_CLEANUP_INTERVAL == 0:
            try:
                table.cleanup_metadata()
            except (OSError, DeltaError) as err:  # the commit stands; the next interval tries again
                log.warning("could not clean up expired log entries of %s: %s", name, err)
        return version

    def _open(self, name: str, create: bool) -> DeltaTable:
        uri = self.uri(name)
        options = self.storage.options or None
        with self.storage.errors(uri):
            try:
                return DeltaTable(uri, storage_options=options)
            except TableNotFoundError:
                if not create:
                    raise LakeError(f"table {name} does not exist yet at {uri}", table_uri=uri) from None
            require_safe_store(self.storage)  # creating a table is the first commit a writer makes
            with contextlib.suppress(CommitFailedError):  # another writer created it first
                return DeltaTable.create(
                    uri, SCHEMAS[name], mode="ignore", storage_options=options, name=name,
                    configuration=table_properties(name, self.config),
                )  # fmt: skip
            return DeltaTable(uri, storage_options=options)

    def version(self, name: str) -> int:
        """Current Delta version of `name` (-1 if it does not exist)."""
        if not self.exists(name):
            return -1
        return self.table(name).version()

    def txn_version(self, name: str, app_id: str) -> int | None:
        """The version stored by the last `txn` action of `app_id` in table `name`."""
        if not self.exists(name):
            return None
        return self.txn(name, self.table(name), app_id)

    def txn(self, name: str, table: DeltaTable, app_id: str) -> int | None:
        """`table.transaction_version(app_id)`, looked up once per table version: delta-rs replays
        the log's `txn` actions for it, 1.2 ms a call at 1B tokens (0.3 ms at 10M), and a sink's
        flush asks for the projections' positions and then checks them before each commit."""
        version = table.version()
        with self._lock:
            known = self._txns.get((name, app_id))
            if known is None or known[0] != version:
                known = self._txns[(name, app_id)] = (version, table.transaction_version(app_id))
            return known[1]

    def stored_columns(self, name: str) -> list[str]:
        """The columns of table `name` as stored (a lake written by an older trajlake may lack some)."""
        return list(self.snapshot(name).schema().to_arrow().names)

    def may_mix_schemas(self, name: str) -> bool:
        """True once `name` gained columns after files were written: older files lack them."""
        return self.txn(name, self.snapshot(name), EVOLVED_APP_ID) is not None

    def evolve(self, name: str) -> None:
        """Add the columns of `SCHEMAS[name]` that the stored table lacks (nullable, at the end).

        A lake written before a field was declared takes that field's column on its first
        write; its older files keep their columns and readers fill the new ones with null.
        """
        with self._lock:
            if name in self._evolved:
                return
            table = self.table(name)
            stored = set(table.schema().to_arrow().names)
            missing = [f for f in SCHEMAS[name] if f.name not in stored]
            if missing:
                marker = Transaction(app_id=EVOLVED_APP_ID, version=len(stored))
                try:
                    table.alter.add_columns(
                        [Field.from_arrow(f) for f in missing],
                        commit_properties=CommitProperties(app_transactions=[marker]),
                    )
                except CommitFailedError:  # another writer evolved it first
                    self.catch_up(name, table)
                    if set(SCHEMAS[name].names) - set(table.schema().to_arrow().names):
                        raise
            self._evolved.add(name)

    def files(self, name: str) -> list[str]:
        """Paths of the Parquet files in the current snapshot of `name`."""
        if not self.exists(name):
            return []
        return list(self.table(name).file_uris())

    def file_stats(self, name: str, within: tuple[str, Any, Any] | None = None) -> pa.Table:
        """The current files of `name`, one row each: `uri`, then the Delta add action's fields
        (`path`, `size_bytes`, `modification_time`, …) and flattened statistics (`min.<column>`,
        `max.<column>`, `null_count.<column>`). Read from the log once per table version.

        `within` (column, lo, hi) keeps the files whose statistics may hold a `column` value in
        [lo, hi] (a file without them is kept)."""
        if not self.exists(name):
            return pa.table({"uri": pa.array([], pa.string())})
        table = self.table(name)
        with self._lock:
            cached = self._file_stats.get(name)
            if cached is None or cached[0] != table.version():
                uris = {uri.rsplit("/", 1)[1]: uri for uri in table.file_uris()}
                actions = pa.table(table.get_add_actions(flatten=True))
                paths = actions.column("path").to_pylist()
                actions = actions.add_column(
                    0, "uri", pa.array([uris[p.rsplit("/", 1)[-1]] for p in paths], pa.string())
                )
                cached = (table.version(), actions)
                self._file_stats[name] = cached
        return cached[1] if within is None else may_hold(cached[1], *within)

    def last_commit_time(self, name: str) -> float:
        """When the latest commit to `name` landed (seconds since the epoch); 0 if its log entry is
        gone, which a clean-up does only past the log's retention.

        Read from the commit's own JSON: delta-rs 1.x `history(1)` on a snapshot that another writer
        has since passed lists the newer commits too, under negative versions."""
        version = self.table(name).version()
        return self.commit_times(name, version - 1, version).get(version, 0.0)

    def commit_times(self, name: str, after: int, upto: int) -> dict[int, float]:
        """version -> when it landed (seconds since the epoch), for the commits after..upto still in the log."""
        times = {}
        for version, actions in self._commits(name, after, upto):
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
            if info is not None and "timestamp" in info:
                times[version] = float(info["timestamp"]) / 1000
        return times

    def _commits(self, name: str, after: int, upto: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """The actions of each commit after..upto, in order; stops at the first one cleaned up."""
        fs, root = self.storage.filesystem()
        for version in range(after + 1, upto + 1):
            try:
                with fs.open_input_stream(f"{root}/{name}/_delta_log/{version:020d}.json") as f:
                    lines = f.read().decode().splitlines()
            except FileNotFoundError:
                return
            yield version, [json.loads(line) for line in lines if line.strip()]

    def added_files(self, name: str, after: int, upto: int) -> list[str] | None:
        """Paths (relative to the table) of the data files that commits after..upto added to `name`,
        rewrites by compaction (`dataChange: false`) left out; None if the log before `upto` is gone.

        Read from the commits' JSON: delta-rs tells a snapshot's files, not which commit added a
        file or whether it changed data (that takes Change Data Feed, which the lake does not keep).
        """
        paths: list[str] = []
        seen = after
        for version, actions in self._commits(name, after, upto):
            seen = version
            paths += [a["add"]["path"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
        return paths if seen == upto else None


def may_hold(files: pa.Table, column: str, lo: Any, hi: Any) -> pa.Table:
    """The rows of `files` (a `file_stats` table) whose statistics may hold a `column` value in
    [lo, hi]; a file without them is kept."""
    if not files.num_rows or f"min.{column}" not in files.column_names:
        return files
    lows, highs = files.column(f"min.{column}"), files.column(f"max.{column}")
    may = pc.and_kleene(
        pc.less_equal(lows, pa.scalar(hi, lows.type)), pc.greater_equal(highs, pa.scalar(lo, highs.type))
    )
    return files.filter(pc.fill_null(may, True))
