"""Errors of the lake: each carries the table or query it concerns and says the fix."""

from __future__ import annotations

from trajlake.schemas.errors import TrajlakeError


class LakeError(TrajlakeError, RuntimeError):
    """A lake operation failed; `table_uri` says where."""

    def __init__(self, message: str, *, table_uri: str | None = None) -> None:
        super().__init__(message)
        self.table_uri = table_uri


class LakeNotFound(LakeError):
    """A path that holds no lake, opened by a reader: `root` is where it looked."""

    def __init__(self, message: str, *, root: str) -> None:
        super().__init__(message, table_uri=root)
        self.root = root


class CommitConflict(LakeError):
    """Another writer committed first and the commit could not be retried; safe to redo."""


class ReadOnlyQueryError(LakeError):
    """A SQL statement tried to write, or to read outside the lake."""


class TxnFenced(LakeError):
    """A `txn` app id moved on since this writer read it: another writer owns that source now.

    The writer must drop what it buffered for that source and resume from the Delta log.
    """

    def __init__(
        self, message: str, *, table_uri: str | None = None, stale: dict[str, tuple] | None = None
    ) -> None:
        super().__init__(message, table_uri=table_uri)
        self.stale = stale or {}


class ProjectorFenced(LakeError):
    """Another projector took over the lake's projections: this one must stop writing them."""


class UnsafeStore(LakeError):
    """The lake's object store accepts a second put-if-absent of one key: concurrent commits
    would overwrite each other, so the lake refuses to write there."""
