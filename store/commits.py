"""Committing to a table: written files and `txn` positions in one Delta transaction, fenced on the
positions a writer last saw, so that two writers never store one range of source offsets twice."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from trajlake.common.retry import retrying
from trajlake.store.delta_log import POST_COMMIT, DeltaLog
from trajlake.store.errors import CommitConflict, TxnFenced
from trajlake.store.put_if_absent import require_safe_store
from trajlake.store.tables import SCHEMAS, conform

COMMIT_RETRIES = 20


class Committer:
    """Commits to a lake's tables through their log."""

    def __init__(self, log: DeltaLog) -> None:
        self.log = log
        self.races = 0
        """Fenced commits that lost a race to another writer and were tried again on a newer snapshot."""

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
        require_safe_store(self.log.storage)
        self.log.evolve(name)
        txns = [Transaction(app_id=k, version=int(v)) for k, v in (app_transactions or {}).items()]
        retries = 0 if expect_txns is not None else COMMIT_RETRIES
        props = CommitProperties(app_transactions=txns or None, max_commit_retries=retries)

        def write(table: DeltaTable) -> None:
            table.create_write_transaction(
                list(actions), mode=mode, schema=SCHEMAS[name], commit_properties=props,
                post_commithook_properties=POST_COMMIT,
            )  # fmt: skip

        if expect_txns is not None:
            return self._fenced(name, expect_txns, write)
        table = self.log.table(name)
        try:
            write(table)
        except CommitFailedError as err:
            raise CommitConflict(f"commit to {name} failed: {err}", table_uri=self.log.uri(name)) from err
        return self.log.committed(name, table)

    def replace_files(self, name: str, added: Sequence[AddAction], removed: Sequence[RemoveAction]) -> int:
        """Commit `added` in place of the files `removed` (the same rows, rewritten) in one Delta
        transaction; return the version.

        It lands only on a snapshot that still holds every removed file, else `CommitConflict`:
        another compaction replaced them first, and committing these rows again would duplicate
        them (Delta itself takes a remove of a file that is already gone).
        """
        require_safe_store(self.log.storage)
        self.log.evolve(name)
        props = CommitProperties(max_commit_retries=0)
        wanted = {action.path for action in removed}

        def write(table: DeltaTable) -> None:
            present = {uri.rsplit("/", 1)[1] for uri in table.file_uris()}
            if gone := sorted(wanted - present):
                raise CommitConflict(
                    f"{len(gone)} of the {len(wanted)} files this commit replaces in {name} were "
                    f"replaced by another writer first (e.g. {gone[0]}); nothing was committed, run it again",
                    table_uri=self.log.uri(name),
                )
            table.create_write_transaction(
                [*added, *removed], mode="append", schema=SCHEMAS[name], commit_properties=props,
                post_commithook_properties=POST_COMMIT,
            )  # fmt: skip

        return self._fenced(name, {}, write)

    def upsert(
        self,
        name: str,
        data: pa.Table,
        keys: Sequence[str],
        app_transactions: Mapping[str, int] | None = None,
        expect_txns: Mapping[str, int | None] | None = None,
    ) -> int:
        """Insert rows, replacing those with the same `keys`, in one Delta MERGE commit (`data` has
        rows); `expect_txns` fences the merge as in `commit`."""
        require_safe_store(self.log.storage)
        self.log.evolve(name)
        predicate = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        txns = [Transaction(app_id=k, version=int(v)) for k, v in (app_transactions or {}).items()]
        source = conform(data, SCHEMAS[name])

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
        table = self.log.table(name)
        try:
            merge(table, COMMIT_RETRIES)
        except CommitFailedError as err:
            raise CommitConflict(f"merge into {name} failed: {err}", table_uri=self.log.uri(name)) from err
        return self.log.committed(name, table)

    def check_txns(self, name: str, expect_txns: Mapping[str, int | None]) -> DeltaTable:
        """The up-to-date table, after checking each app id still has the expected version."""
        table = self.log.table(name)
        stale = {}
        for app_id, expected in expect_txns.items():
            stored = self.log.txn(name, table, app_id)
            if stored != expected:
                stale[app_id] = (expected, stored)
        if stale:
            detail = ", ".join(f"{a}: expected {e}, found {f}" for a, (e, f) in stale.items())
            raise TxnFenced(
                f"another writer committed to {name} first ({detail})",
                table_uri=self.log.uri(name),
                stale=stale,
            )
        return table

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
                    try:
                        write(table)
                    except CommitFailedError:
                        self.races += 1
                        raise
        except CommitFailedError:
            raise CommitConflict(
                f"commit to {name} kept losing races with other writers", table_uri=self.log.uri(name)
            ) from None
        return self.log.committed(name, table)
