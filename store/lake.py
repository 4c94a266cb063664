"""The lake: Delta tables under one root, written as Parquet we lay out ourselves.

Appends write one Parquet file with pyarrow (zstd, byte-stream-split token lists) and commit
it with delta-rs in a single Delta transaction that may carry `txn` actions (source
offsets, projection positions), so rows and positions land together or not at all.
Reads go through DuckDB over the files of the current Delta snapshot.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from trajlake.schemas.retry import retrying
from trajlake.schemas.tables import STORED_EVENTS_SCHEMA, TABLE_SCHEMAS
from trajlake.store.config import LakeConfig
from trajlake.store.errors import CommitConflict, LakeError, TxnFenced
from trajlake.store.summaries import is_summarized, summarize, summary, with_summary

TABLES = ("events", *TABLE_SCHEMAS)
SCHEMAS: dict[str, pa.Schema] = {"events": STORED_EVENTS_SCHEMA, **TABLE_SCHEMAS}
STATS_COLUMNS = ("run_id", "trajectory_id", "seq", "event_type", "step", "event_time", "group_id",
                 "policy_version_min", "finished", "started_at")  # fmt: skip
"""Columns whose min/max go into the Delta log, so readers can skip files (`files_within`; the
sampler's staleness window and groups) or answer from the log alone (the dashboards' run list)."""

COMMIT_RETRIES = 20
CHECKPOINT_INTERVAL = 10
"""Commits between the Delta checkpoints delta-rs writes after a commit (its default: 100). A
reader opens a table from its last checkpoint and replays each commit after it: at 160 files,
0.08 s with 95 commits to replay and 0.007-0.02 s from a checkpoint at its head; writing one took
0.09 s. An engine opens six tables."""
POST_COMMIT = PostCommitHookProperties(cleanup_expired_logs=False)
"""After a commit: a checkpoint at the table's interval, but no clean-up of expired log entries,
which delta-rs runs after every commit by listing the whole `_delta_log` and stat'ing each entry.
The log keeps every commit of `delta.logRetentionDuration` (`LakeConfig.log_retention_hours`), so
that cost grew with the run: at 1B tokens (1,100 entries) 10-14 ms of a 20 ms commit. `_committed`
cleans up once every `LOG_CLEANUP_INTERVAL` versions instead."""
LOG_CLEANUP_INTERVAL = 100
"""Versions between clean-ups of a table's expired log entries (a list of its `_delta_log`)."""
EVOLVED_APP_ID = "trajlake-schema"
"""A `txn` app id in the commit that gave a table new columns: its files may lack some of them."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
log = logging.getLogger(__name__)


def _is_file(path: str) -> bool:
    """True if `path` exists; False if it does not; any other error (permissions, a file where a
    directory should be) is raised: it says nothing about whether the table exists."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    return True


def _storage_options_from_env() -> dict[str, str]:
    keys = (
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_ALLOW_HTTP",
        "AWS_S3_ALLOW_UNSAFE_RENAME",
        "AWS_CONDITIONAL_PUT",
    )
    return {k: os.environ[k] for k in keys if k in os.environ}


class Lake:
    """All tables of one lake root (a local directory, or `s3://bucket/prefix`)."""

    def __init__(
        self,
        root: str | Path,
        config: LakeConfig | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        root = str(root)
        self.is_local = "://" not in root or root.startswith("file://")
        self.root = str(Path(root.removeprefix("file://")).resolve()) if self.is_local else root.rstrip("/")
        self.config = config or LakeConfig()
        self.storage_options = dict(storage_options or _storage_options_from_env())
        self._tables: dict[str, DeltaTable] = {}
        self._file_stats: dict[str, tuple[int, pa.Table]] = {}
        """name -> (version, `file_stats`)."""
        self._txns: dict[tuple[str, str], tuple[int, int | None]] = {}
        """(table, app id) -> (table version, its `txn` version there): `_txn`'s cache."""
        self._evolved: set[str] = set()  # tables whose stored schema has every column of SCHEMAS
        self._lock = threading.RLock()
        self._sql: Any = None
        if self.is_local:
            with self._storage_errors(self.root):
                Path(self.root).mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"Lake({self.root!r})"

    # -- tables --------------------------------------------------------------------------
    def uri(self, name: str) -> str:
        """The Delta table URI of `name`."""
        if name not in SCHEMAS:
            raise LakeError(f"unknown table {name!r}; the lake has {', '.join(TABLES)}")
        return f"{self.root}/{name}"

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the lake root's path in it, reaching the storage delta-rs reaches."""
        if self.is_local:
            return pafs.LocalFileSystem(), self.root
        if self.root.startswith("s3://"):
            return _s3_filesystem(self.storage_options), self.root.removeprefix("s3://")
        fs, path = pafs.FileSystem.from_uri(self.root)
        return fs, path

    def exists(self, name: str) -> bool:
        """True if table `name` has been created."""
        if name in self._tables:  # tables are never dropped: once opened, always there
            return True
        # an error is not "no table": the storage did not answer, so nothing can be said
        with self._storage_errors(self.uri(name)):
            if self.is_local:
                # a table exists from its first commit (version 0, written put-if-absent) on, and
                # a log cleaned up since keeps a checkpoint: two stats, where delta-rs lists the
                # whole log (6 ms for 1,077 commits), and every reader asks for each table it opens
                log = f"{self.uri(name)}/_delta_log"
                return _is_file(f"{log}/{0:020d}.json") or _is_file(f"{log}/_last_checkpoint")
            return DeltaTable.is_deltatable(self.uri(name), storage_options=self.storage_options or None)

    def delta(self, name: str, create: bool = True) -> DeltaTable:
        """The up-to-date `DeltaTable` for `name`, created empty on first use."""
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                table = self._open(name, create)
                self._tables[name] = table
            else:
                self._catch_up(name, table)
            return table

    def _catch_up(self, name: str, table: DeltaTable) -> None:
        """Load into `table` the commits written since its version.

        In a local lake a commit is the file `_delta_log/<version + 1>.json` appearing (Delta
        writes it put-if-absent), so a `stat` or two say whether there is any: 8 µs each where
        delta-rs lists the log in 0.3 ms, and a sink commit or a query engine checks every table.
        A log clean-up removes the commits before a checkpoint once they are older than the
        table's retention; a reader that old finds its own commit gone too, and loads from the
        checkpoint.
        """
        if self.is_local:
            log, version = f"{self.uri(name)}/_delta_log", table.version()
            if not _is_file(f"{log}/{version + 1:020d}.json") and _is_file(f"{log}/{version:020d}.json"):
                return
        table.update_incremental()

    def _committed(self, name: str, table: DeltaTable) -> int:
        """After this writer's commit to `name`: load it and any later commits, and now and then
        delete the log entries past retention (`POST_COMMIT`); return the version."""
        self._catch_up(name, table)
        version = table.version()
        if version % LOG_CLEANUP_INTERVAL == 0:
            try:
                table.cleanup_metadata()
            except (OSError, DeltaError) as err:  # the commit stands; the next interval tries again
                log.warning("could not clean up expired log entries of %s: %s", name, err)
        return version

    def _open(self, name: str, create: bool) -> DeltaTable:
        uri = self.uri(name)
        options = self.storage_options or None
        with self._storage_errors(uri):
            try:
                return DeltaTable(uri, storage_options=options)
            except TableNotFoundError:
                if not create:
                    raise LakeError(f"table {name} does not exist yet at {uri}", table_uri=uri) from None
            with contextlib.suppress(CommitFailedError):  # another writer created it first
                return DeltaTable.create(
                    uri, SCHEMAS[name], mode="ignore", storage_options=options, name=name,
                    configuration=_table_properties(name, self.config),
                )  # fmt: skip
            return DeltaTable(uri, storage_options=options)

    @contextlib.contextmanager
    def _storage_errors(self, uri: str) -> Iterator[None]:
        """Storage that refused or never answered (OSError of delta-rs or pyarrow) -> a LakeError naming the fix."""
        try:
            yield
        except OSError as err:
            raise LakeError(self._unreachable(err), table_uri=uri) from None

    def _unreachable(self, err: OSError) -> str:
        """What to fix when the lake's storage refused or never answered."""
        # delta-rs nests its causes over several coloured lines: keep the outermost and the root
        lines = [_ANSI.sub("", line).replace("↳", "").strip() for line in str(err).splitlines()]
        lines = [line for line in lines if line]
        cause = " … ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else type(err).__name__
        fix = (
            f"check that {self.root} is a directory this user can write"
            if self.is_local
            else "check AWS_ENDPOINT_URL, the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) "
            "and that the bucket exists"
        )
        return f"cannot use the lake at {self.root} ({cause}); {fix}"

    def version(self, name: str) -> int:
        """Current Delta version of `name` (-1 if it does not exist)."""
        if not self.exists(name):
            return -1
        return self.delta(name).version()

    def txn_version(self, name: str, app_id: str) -> int | None:
        """The version stored by the last `txn` action of `app_id` in table `name`."""
        if not self.exists(name):
            return None
        return self._txn(name, self.delta(name), app_id)

    def _txn(self, name: str, table: DeltaTable, app_id: str) -> int | None:
        """`table.transaction_version(app_id)`, looked up once per table version: delta-rs replays
        the log's `txn` actions for it, 1.2 ms a call at 1B tokens (0.3 ms at 10M), and a sink's
        flush asks for the projections' positions and then checks them before each commit."""
        version = table.version()
        with self._lock:
            known = self._txns.get((name, app_id))
            if known is None or known[0] != version:
                known = self._txns[(name, app_id)] = (version, table.transaction_version(app_id))
            return known[1]

    def _snapshot(self, name: str) -> DeltaTable:
        """The table as last loaded (by `files`, `version`, …), without polling the log again."""
        with self._lock:
            return self._tables.get(name) or self.delta(name)

    def stored_columns(self, name: str) -> list[str]:
        """The columns of table `name` as stored (a lake written by an older trajlake may lack some)."""
        return list(self._snapshot(name).schema().to_arrow().names)

    def may_mix_schemas(self, name: str) -> bool:
        """True once `name` gained columns after files were written: older files lack them."""
        return self._txn(name, self._snapshot(name), EVOLVED_APP_ID) is not None

    def _evolve(self, name: str) -> None:
        """Add the columns of `SCHEMAS[name]` that the stored table lacks (nullable, at the end).

        A lake written before a field was declared takes that field's column on its first
        write; its older files keep their columns and readers fill the new ones with null.
        """
        with self._lock:
            if name in self._evolved:
                return
            table = self.delta(name)
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
                    self._catch_up(name, table)
                    if set(SCHEMAS[name].names) - set(table.schema().to_arrow().names):
                        raise
            self._evolved.add(name)

    def files(self, name: str) -> list[str]:
        """Paths of the Parquet files in the current snapshot of `name`."""
        if not self.exists(name):
            return []
        return list(self.delta(name).file_uris())

    def file_stats(self, name: str, within: tuple[str, Any, Any] | None = None) -> pa.Table:
        """The current files of `name`, one row each: `uri`, then the Delta add action's fields
        (`path`, `size_bytes`, `modification_time`, …) and flattened statistics (`min.<column>`,
        `max.<column>`, `null_count.<column>`). Read from the log once per table version.

        `within` (column, lo, hi) keeps the files whose statistics may hold a `column` value in
        [lo, hi] (a file without them is kept)."""
        if not self.exists(name):
            return pa.table({"uri": pa.array([], pa.string())})
        table = self.delta(name)
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
        return cached[1] if within is None else _may_hold(cached[1], *within)

    def files_within(self, name: str, column: str, lo: Any, hi: Any) -> list[str]:
        """Paths of the current files of `name` that may hold a `column` value in [lo, hi].

        Decided from the min/max statistics in the Delta log (a file without them is kept), so
        a point or range read opens only those files, not the footer of every file: time-ordered
        ids (UUIDv7) and event times put each value in one or two of a long run's files.
        """
        return self.file_stats(name, (column, lo, hi)).column("uri").to_pylist()

    # -- writes --------------------------------------------------------------------------
    def write_file(self, name: str, data: pa.Table) -> AddAction:
        """Write `data` as one new Parquet file of table `name` (not yet committed); events
        get their token summary (`store/summaries.py`) unless they carry it."""
        self._evolve(name)  # creates the table (and its directory) on first write
        data = _cast(summarize(data) if name == "events" else data, SCHEMAS[name])
        if data.num_columns and data.column(0).num_chunks > 1:
            data = data.combine_chunks()  # many small batches write far slower than one

        def write(out: Any) -> dict[str, Any]:
            pq.write_table(data, out, **self._parquet_options(data.schema))
            return _stats(data)

        return self._new_file(name, write)

    def write_batches(self, name: str, batches: Iterable[pa.RecordBatch]) -> AddAction:
        """Write a stream of batches as one new Parquet file of `name` (not yet committed).

        Memory holds one row group (`row_group_rows`) at a time, however big the file: how
        `compact` merges files.
        """
        self._evolve(name)
        schema = SCHEMAS[name]
        options = self._parquet_options(schema)
        group_rows = options.pop("row_group_size")

        def write(out: Any) -> dict[str, Any]:
            stats = _stats(schema.empty_table())
            pending: list[pa.RecordBatch] = []
            with pq.ParquetWriter(out, schema, **options) as writer:

                def flush() -> None:
                    nonlocal stats
                    group = pa.Table.from_batches(pending)
                    if name == "events":  # rows of a file older than the token summary get it
                        group = summarize(group)
                    group = _cast(group, schema).combine_chunks()
                    writer.write_table(group, row_group_size=group_rows)
                    stats = _merge_stats(stats, _stats(group))
                    pending.clear()

                for batch in batches:
                    pending.append(batch)
                    if sum(b.num_rows for b in pending) >= group_rows:
                        flush()
                if pending:
                    flush()
            return stats

        return self._new_file(name, write)

    def _new_file(self, name: str, write: Callable[[Any], dict[str, Any]]) -> AddAction:
        """A new file of `name`, its bytes written by `write(stream)`, which returns its Delta stats.

        Locally the file is written under a temporary name and renamed: a reader never sees a
        half-written file.
        """
        rel = f"part-{int(time.time() * 1000):013d}-{uuid.uuid4().hex}.zstd.parquet"
        fs, root = self.filesystem()
        path = f"{root}/{name}/{rel}"
        tmp = f"{root}/{name}/.{rel}.tmp" if self.is_local else path
        with fs.open_output_stream(tmp) as out:
            stats = write(out)
        if self.is_local:
            os.replace(tmp, path)
        size = fs.get_file_info(path).size
        return AddAction(rel, size, {}, int(time.time() * 1000), True, json.dumps(stats))

    def write_files(self, name: str, data: pa.Table) -> list[AddAction]:
        """Write `data` as `file_parts(rows)` files, in parallel threads (pyarrow releases the GIL).

        A table whose chunks are the parts (see `combine_in_parts`) is split at its chunk
        boundaries, so each thread writes contiguous memory.
        """
        parts = file_parts(data.num_rows)
        if parts == 1:
            return [self.write_file(name, data)] if data.num_rows else []
        slices = split_rows(data, parts)
        with ThreadPoolExecutor(len(slices)) as pool:
            return list(pool.map(lambda part: self.write_file(name, part), slices))

    def _parquet_options(self, schema: pa.Schema) -> dict[str, Any]:
        # token ids and logprobs: zstd finds the bytes of one significance together, as entropy coding
        # needs (ids 14.0 -> 11.3 bits, their order-0 entropy 9.9; logprobs near their entropy)
        numeric_lists = [
            f"{f.name}.list.element"
            for f in schema
            if pa.types.is_list(f.type)
            and (pa.types.is_integer(f.type.value_type) or pa.types.is_floating(f.type.value_type))
        ]
        split = numeric_lists if self.config.byte_stream_split else []
        scalars = [f.name for f in schema if not pa.types.is_list(f.type)]
        return {
            "compression": self.config.compression,
            "compression_level": self.config.compression_level,
            "row_group_size": self.config.row_group_rows,
            # dictionaries pay off for repetitive strings; for Zipf token ids they only cost time
            "use_dictionary": [f.name for f in schema if pa.types.is_string(f.type)],
            "use_byte_stream_split": split or False,
            # min/max of scalar columns let DuckDB skip row groups; on token lists they are noise
            "write_statistics": scalars,
        }

    def commit(
        self,
        name: str,
        actions: Sequence[AddAction],
        app_transactions: Mapping[str, int] | None = None,
        mode: str = "append",
        expect_txns: Mapping[str, int | None] | None = None,
    ) -> int:
        """Commit written files (and `txn` actions) in one Delta transaction; return the version.

        With `expect_txns` (app id -> the version this writer last saw, None for none), the
        commit lands only on a snapshot where every listed app id still has that version,
        else `TxnFenced` is raised: how a sink that lost its partitions is kept from
        committing them twice.
        """
        self._evolve(name)
        txns = [Transaction(app_id=k, version=int(v)) for k, v in (app_transactions or {}).items()]
        if expect_txns is not None:
            return self._commit_fenced(name, actions, txns, mode, expect_txns)
        props = CommitProperties(app_transactions=txns or None, max_commit_retries=COMMIT_RETRIES)
        table = self.delta(name)
        try:
            table.create_write_transaction(
                list(actions), mode=mode, schema=SCHEMAS[name], commit_properties=props,
                post_commithook_properties=POST_COMMIT,
            )  # fmt: skip
        except CommitFailedError as err:
            raise CommitConflict(f"commit to {name} failed: {err}", table_uri=self.uri(name)) from err
        return self._committed(name, table)

    def replace_files(self, name: str, added: Sequence[AddAction], removed: Sequence[RemoveAction]) -> int:
        """Commit `added` in place of the files `removed` (the same rows, rewritten) in one Delta
        transaction; return the version.

        It lands only on a snapshot that still holds every removed file, else `CommitConflict`:
        another compaction replaced them first, and committing these rows again would duplicate
        them (Delta itself takes a remove of a file that is already gone).
        """
        self._evolve(name)
        props = CommitProperties(max_commit_retries=0)
        wanted = {action.path for action in removed}

        def write(table: DeltaTable) -> None:
            present = {uri.rsplit("/", 1)[1] for uri in table.file_uris()}
            if gone := sorted(wanted - present):
                raise CommitConflict(
                    f"{len(gone)} of the {len(wanted)} files this commit replaces in {name} were "
                    f"replaced by another writer first (e.g. {gone[0]}); nothing was committed, run it again",
                    table_uri=self.uri(name),
                )
            table.create_write_transaction(
                [*added, *removed], mode="append", schema=SCHEMAS[name], commit_properties=props,
                post_commithook_properties=POST_COMMIT,
            )  # fmt: skip

        return self._fenced(name, {}, write)

    def check_txns(self, name: str, expect_txns: Mapping[str, int | None]) -> DeltaTable:
        """The up-to-date table, after checking each app id still has the expected version."""
        table = self.delta(name)
        stale = {}
        for app_id, expected in expect_txns.items():
            stored = self._txn(name, table, app_id)
            if stored != expected:
                stale[app_id] = (expected, stored)
        if stale:
            detail = ", ".join(f"{a}: expected {e}, found {f}" for a, (e, f) in stale.items())
            raise TxnFenced(
                f"another writer committed to {name} first ({detail})", table_uri=self.uri(name), stale=stale
            )
        return table

    def _commit_fenced(
        self,
        name: str,
        actions: Sequence[AddAction],
        txns: list[Transaction],
        mode: str,
        expect_txns: Mapping[str, int | None],
    ) -> int:
        props = CommitProperties(app_transactions=txns or None, max_commit_retries=0)
        return self._fenced(
            name,
            expect_txns,
            lambda table: table.create_write_transaction(
                list(actions),
                mode=mode,
                schema=SCHEMAS[name],
                commit_properties=props,
                post_commithook_properties=POST_COMMIT,
            ),
        )

    def _fenced(
        self, name: str, expect_txns: Mapping[str, int | None], write: Callable[[DeltaTable], Any]
    ) -> int:
        """Run `write` (a commit with zero delta-rs retries) on a snapshot where `expect_txns` hold.

        Zero retries: a commit that lost a race fails instead of being rebased blindly onto a
        snapshot where another writer may have stored the same offsets; it is re-checked here.
        """
        try:
            for attempt in retrying(
                retry_on=CommitFailedError, attempts=COMMIT_RETRIES * 5, wait=lambda n: min(0.5, 0.01 * n)
            ):
                with attempt:
                    table = self.check_txns(name, expect_txns)  # TxnFenced is final: not retried
                    write(table)
        except CommitFailedError:
            raise CommitConflict(
                f"commit to {name} kept losing races with other writers", table_uri=self.uri(name)
            ) from None
        return self._committed(name, table)

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
        """Insert rows, replacing those with the same `keys`, in one Delta MERGE commit.

        `expect_txns` fences the merge as in `commit`.
        """
        if not data.num_rows:
            if expect_txns is not None:
                return self.commit(name, [], app_transactions, expect_txns=expect_txns)
            return self.append(name, data, app_transactions)
        self._evolve(name)
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        txns = [Transaction(app_id=k, version=int(v)) for k, v in (app_transactions or {}).items()]
        source = _cast(data, SCHEMAS[name])

        def merge(table: DeltaTable, retries: int) -> None:
            props = CommitProperties(app_transactions=txns or None, max_commit_retries=retries)
            (
                table.merge(
                    source,
                    predicate=predicate,
                    source_alias="s",
                    target_alias="t",
                    commit_properties=props,
                    post_commithook_properties=POST_COMMIT,
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )

        if expect_txns is not None:
            return self._fenced(name, expect_txns, lambda table: merge(table, 0))
        table = self.delta(name)
        try:
            merge(table, COMMIT_RETRIES)
        except CommitFailedError as err:
            raise CommitConflict(f"merge into {name} failed: {err}", table_uri=self.uri(name)) from err
        return self._committed(name, table)

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
        from trajlake.store.sql import placeholders, read_files

        if among is not None:
            column, values = among
            if not values:
                return read_files(self, name, columns, "false", None, [], select=select, by_file=by_file)
            if isinstance(params, Mapping) or within is not None:
                raise TypeError("read(among=...) takes positional params (`?`) and no `within`")
            lo, hi = min(values), max(values)
            where = (f"({where}) and " if where else "") + (
                f'"{column}" between ? and ? and "{column}" in ({placeholders(len(values))})'
            )
            params, within = [*(params or ()), lo, hi, *values], (column, lo, hi)
        if files is not None:
            uris = (files if within is None else _may_hold(files, *within)).column("uri").to_pylist()
        else:
            uris = self.files_within(name, *within) if within else None
        return read_files(self, name, columns, where, params, uris, select=select, by_file=by_file)

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


def _s3_filesystem(storage_options: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 client with the endpoint and credentials the lake gives delta-rs (`AWS_*` options)."""
    o = {k.upper(): v for k, v in storage_options.items()}
    kwargs: dict[str, Any] = {}
    if endpoint := o.get("AWS_ENDPOINT_URL"):
        scheme, sep, host = endpoint.partition("://")
        kwargs["endpoint_override"] = host.rstrip("/") if sep else endpoint
        if sep:
            kwargs["scheme"] = scheme
    names = {
        "AWS_ACCESS_KEY_ID": "access_key",
        "AWS_SECRET_ACCESS_KEY": "secret_key",
        "AWS_SESSION_TOKEN": "session_token",
        "AWS_REGION": "region",
    }
    kwargs.update({arg: o[key] for key, arg in names.items() if o.get(key)})
    return pafs.S3FileSystem(**kwargs)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


MIN_ROWS_PER_FILE = 20_000
"""Fewest rows worth a file (and a writing thread) of their own in `write_files`."""


def file_parts(rows: int) -> int:
    """How many files `write_files` writes `rows` as: one per core, each of `MIN_ROWS_PER_FILE` or more."""
    return max(1, min(_cores(), rows // MIN_ROWS_PER_FILE))


def split_rows(data: pa.Table, parts: int) -> list[pa.Table]:
    """`data` as up to `parts` contiguous slices (no copy), one for a thread each: at its chunk
    boundaries when it has that many chunks (see `combine_in_parts`), else of about equal rows."""
    if data.num_columns and data.column(0).num_chunks == parts:
        bounds = np.cumsum([0] + [len(c) for c in data.column(0).chunks])
    else:
        bounds = np.linspace(0, data.num_rows, parts + 1).astype(int)
    return [data.slice(int(a), int(b - a)) for a, b in itertools.pairwise(bounds) if b > a]


SUMMARIZE_SLICE_ROWS = 4_096
"""Fewest events worth a thread of their own in `summarized`."""


def summarized(events: pa.Table) -> pa.Table:
    """`summarize(events)`, slices of rows on a thread per core: rows are independent, and
    numpy's hashing and sorts and pyarrow's kernels release the GIL. On `bench/store_write.py`'s
    44k events (15.9M tokens), 0.20 s in one thread and 0.16 s (0.25 CPU-s) in two; while the
    n-gram hashing made a numpy call per 4,096 values, two threads took 0.33 s (0.46 CPU-s)."""
    parts = max(1, min(_cores(), events.num_rows // SUMMARIZE_SLICE_ROWS))
    if parts == 1 or is_summarized(events):
        return summarize(events)
    slices = split_rows(events, parts)
    with ThreadPoolExecutor(len(slices)) as pool:
        # only the small summary columns are concatenated: the events keep their chunks
        return with_summary(events, pa.concat_tables(pool.map(summary, slices)).combine_chunks())


def combine_in_parts(tables: Sequence[pa.Table]) -> pa.Table:
    """Concatenate many small tables into one whose chunks are one contiguous block per file
    `write_files` will write (`file_parts`), each combined on a thread of its own.

    Parquet writes contiguous memory several times faster than thousands of small batches.
    A batch of one file is one block: split in two, the file's writer would copy it whole
    again, and validation would copy its token lists to read them as one array.
    """
    if not tables:
        raise ValueError("no tables to combine")
    parts = min(file_parts(sum(t.num_rows for t in tables)), len(tables))
    if parts == 1:
        return pa.concat_tables(tables).combine_chunks()
    bounds = np.linspace(0, len(tables), parts + 1).astype(int)
    groups = [tables[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    with ThreadPoolExecutor(len(groups)) as pool:
        blocks = list(pool.map(lambda g: pa.concat_tables(g).combine_chunks(), groups))
    return pa.concat_tables(blocks)


def _cast(data: pa.Table, schema: pa.Schema) -> pa.Table:
    if data.schema.equals(schema):
        return data
    missing = [f.name for f in schema if f.name not in data.column_names]
    for name in missing:
        data = data.append_column(name, pa.nulls(data.num_rows, schema.field(name).type))
    return data.select(schema.names).cast(schema)


def _merge_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The Delta statistics of two files' rows together."""
    merged = {"numRecords": a["numRecords"] + b["numRecords"], "minValues": {}, "maxValues": {}}
    for key, pick in (("minValues", min), ("maxValues", max)):
        for col in a[key].keys() | b[key].keys():
            values = [v for v in (a[key].get(col), b[key].get(col)) if v is not None]
            merged[key][col] = pick(values)
    names = a["nullCount"].keys() | b["nullCount"].keys()
    merged["nullCount"] = {c: a["nullCount"].get(c, 0) + b["nullCount"].get(c, 0) for c in names}
    return merged


def _table_properties(name: str, config: LakeConfig) -> dict[str, str]:
    """The Delta properties a new table of `name` is created with: its checkpoint interval, how
    long its log keeps a commit, and which columns have statistics (`STATS_COLUMNS`: what our
    writer records, and what delta-rs reads back, where it would otherwise keep only the first 32
    columns' and drop e.g. `trajectories.started_at`; its MERGE writes the same)."""
    properties = {
        "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
        "delta.logRetentionDuration": f"interval {config.log_retention_hours} hours",
    }
    columns = [c for c in STATS_COLUMNS if c in SCHEMAS[name].names]
    if columns:
        properties["delta.dataSkippingStatsColumns"] = ",".join(columns)
    return properties


def _may_hold(files: pa.Table, column: str, lo: Any, hi: Any) -> pa.Table:
    """The rows of `files` (a `Lake.file_stats` table) whose statistics may hold a `column` value
    in [lo, hi]; a file without them is kept."""
    if not files.num_rows or f"min.{column}" not in files.column_names:
        return files
    lows, highs = files.column(f"min.{column}"), files.column(f"max.{column}")
    may = pc.and_kleene(
        pc.less_equal(lows, pa.scalar(hi, lows.type)), pc.greater_equal(highs, pa.scalar(lo, highs.type))
    )
    return files.filter(pc.fill_null(may, True))


def _stats(data: pa.Table) -> dict[str, Any]:
    stats: dict[str, Any] = {"numRecords": data.num_rows}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in STATS_COLUMNS:
        if name not in data.column_names:
            continue
        col = data.column(name)
        nulls[name] = col.null_count
        if data.num_rows and col.null_count < data.num_rows:
            mm = pc.min_max(col)
            lo[name], hi[name] = _stat_value(mm["min"].as_py()), _stat_value(mm["max"].as_py())
    stats.update(minValues=lo, maxValues=hi, nullCount=nulls)
    return stats


def _stat_value(value: Any) -> Any:
    """A min/max as the Delta log stores it: timestamps as ISO-8601 UTC strings, to the microsecond
    (one fixed width, so `_merge_stats` compares them as strings)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value
