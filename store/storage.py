"""Where a lake lives: its root (a local directory or `s3://bucket/prefix`), the object store's
options, a pyarrow filesystem reaching what delta-rs reaches, and storage errors that name the fix."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from trajlake.common.retry import retrying
from trajlake.store.errors import LakeError

if TYPE_CHECKING:
    import tenacity

log = logging.getLogger(__name__)

STORAGE_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ALLOW_HTTP",
    "AWS_S3_ALLOW_UNSAFE_RENAME",
    "AWS_CONDITIONAL_PUT",
)
"""The environment variables that configure the object store, passed to delta-rs as they are."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TRANSIENT = re.compile(
    r"connection refused|connection reset|connection closed|broken pipe|error sending request|tcp connect"
    r"|timed out|NETWORK_CONNECTION|\b50[0234]\b|ServiceUnavailable|SlowDown|InternalError",
    re.IGNORECASE,
)
"""What the object store's clients (delta-rs's object_store, pyarrow's AWS SDK) say of a store that
did not answer, or answered "not now"."""


def is_file(path: str) -> bool:
    """True if local `path` exists; False if it does not; any other error (permissions, a file where
    a directory should be) is raised: it says nothing about whether the table exists."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    return True


class Storage:
    """A lake root and how to reach it."""

    def __init__(self, root: str | Path, storage_options: Mapping[str, str] | None = None) -> None:
        root = str(root)
        self.is_local = "://" not in root or root.startswith("file://")
        self.root = str(Path(root.removeprefix("file://")).resolve()) if self.is_local else root.rstrip("/")
        self.options = dict(storage_options or {k: os.environ[k] for k in STORAGE_ENV if k in os.environ})

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the root's path in it, reaching the storage delta-rs reaches."""
        if self.is_local:
            return pafs.LocalFileSystem(), self.root
        if self.root.startswith("s3://"):
            return s3_filesystem(self.options), self.root.removeprefix("s3://")
        fs, path = pafs.FileSystem.from_uri(self.root)
        return fs, path

    def make_root(self) -> None:
        """Create a local root directory (an object store needs none)."""
        if self.is_local:
            with self.errors(self.root):
                Path(self.root).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def errors(self, uri: str) -> Iterator[None]:
        """Storage that refused or never answered (OSError of delta-rs or pyarrow) -> a LakeError naming the fix."""
        try:
            yield
        except OSError as err:
            raise LakeError(self.unreachable(err), table_uri=uri) from None

    def unreachable(self, err: OSError) -> str:
        """What to fix when the lake's storage refused or never answered."""
        # delta-rs nests its causes over several coloured lines: keep the outermost and the root
        lines = [_ANSI.sub("", line).replace("↳", "").strip() for line in str(err).splitlines()]
        lines = [line for line in lines if line]
        cause = " … ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else type(err).__name__
        key = {k.upper(): v for k, v in self.options.items()}.get("AWS_ACCESS_KEY_ID")
        fix = (
            f"check that {self.root} is a directory this user can write"
            if self.is_local
            else "check AWS_ENDPOINT_URL, the credentials (AWS_ACCESS_KEY_ID"
            + (f"={key}" if key else "")
            + ", AWS_SECRET_ACCESS_KEY) and that the bucket exists"
        )
        return f"cannot use the lake at {self.root} ({cause}); {fix}"


def is_transient(err: BaseException) -> bool:
    """True for a storage error that trying again may cure: the store did not answer (refused or
    reset connections, timeouts) or answered that it could not serve now (5xx, SlowDown); False for
    one it answered for good (a refused key, a missing bucket)."""
    import duckdb
    from deltalake.exceptions import DeltaError  # delta-rs's own, e.g. reading the log after a commit

    said = _ANSI.sub("", str(err))
    # DuckDB says a scan's I/O error (pyarrow's, reading files) as its own, e.g. InvalidInputException
    io = isinstance(err, OSError | LakeError | DeltaError) or (
        isinstance(err, duckdb.Error) and "IOError" in said
    )
    return io and bool(_TRANSIENT.search(said))


STORE_OUTAGE_S = 120.0
"""How long a long-running writer (a sink, the projector) waits out a store that does not answer,
trying again; past it, the error stops it (below Kafka's `max.poll.interval.ms`, 5 min: a sink
waiting on its store keeps its partitions)."""


def through_outages(what: str) -> tenacity.Retrying:
    """A retry loop (`for tried in through_outages(...): with tried: ...`) that tries `what` again
    while the store does not answer (`is_transient`), for up to `STORE_OUTAGE_S`, saying each try."""

    def outage(err: BaseException) -> bool:
        if not is_transient(err):
            return False
        said = _ANSI.sub("", str(err)).strip() or type(err).__name__
        log.warning("the lake's store did not answer %s (%s); trying again", what, said.splitlines()[0][:200])
        return True

    return retrying(retry_on=outage, deadline_s=STORE_OUTAGE_S, wait=lambda n: min(5.0, 0.25 * 2**n))


def s3_filesystem(storage_options: Mapping[str, str], **kwargs: Any) -> pafs.S3FileSystem:
    """pyarrow's S3 client with the endpoint and credentials the lake gives delta-rs (`AWS_*` options);
    `kwargs` go to `S3FileSystem` as they are."""
    o = {k.upper(): v for k, v in storage_options.items()}
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
