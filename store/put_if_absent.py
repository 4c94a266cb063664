"""Whether several writers may share a lake's object store: it must refuse a second put-if-absent.

delta-rs commits version N of a table by writing `_delta_log/N.json` only if it is absent (on S3,
a PUT with `If-None-Match: *`). A store that accepts the header and ignores it lets two writers
whose commits race both write version N: the second overwrites the first, whose rows, offsets or
projection positions vanish without an error. delta-rs lists the log before it puts, so only a
true race reaches the store's check; the probe asks the store directly instead: before a process
first writes to a bucket it puts one scratch object twice with `If-None-Match: *`, and the store
is safe if it refuses the second put (412). The answer is kept per bucket for the process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from trajlake.store.errors import LakeError, UnsafeStore
from trajlake.store.storage import Storage

log = logging.getLogger(__name__)

PROBE_PREFIX = "_trajlake_put_if_absent_probe"
"""Where under a lake root the scratch objects go (each deleted after its probe)."""


@dataclass(frozen=True)
class StoreCheck:
    """What the probe found for one bucket."""

    store: str
    """The object store: its endpoint and bucket."""
    safe: bool
    """True if it refused a second put-if-absent of one key."""

    def describe(self) -> str:
        """One line for a report."""
        if self.safe:
            return f"{self.store} refuses a second put-if-absent: concurrent writers are safe"
        return f"{self.store} accepted a second put-if-absent of one key: concurrent writers lose commits"


_checked: dict[str, StoreCheck] = {}
_lock = threading.Lock()


def store_name(storage: Storage) -> str:
    """The endpoint and bucket of an object-store lake (`s3://bucket at http://host:port`)."""
    bucket = storage.root.split("://", 1)[1].split("/", 1)[0]
    endpoint = {k.upper(): v for k, v in storage.options.items()}.get("AWS_ENDPOINT_URL", "AWS")
    return f"s3://{bucket} at {endpoint}"


def check_store(storage: Storage) -> StoreCheck | None:
    """Probe the lake's bucket once per process (None for a local lake: delta-rs links each log
    entry into place, which fails where it exists); storage errors raise `LakeError`."""
    if storage.is_local:
        return None
    name = store_name(storage)
    with _lock:
        if name not in _checked:
            _checked[name] = StoreCheck(name, _refuses_second_put(storage))
        return _checked[name]


def require_safe_store(storage: Storage) -> None:
    """Raise `UnsafeStore` if the lake's object store would let two writers commit one version."""
    check = check_store(storage)
    if check is not None and not check.safe:
        raise UnsafeStore(
            f"refusing to write the lake at {storage.root}: {check.store} accepted a second put-if-absent "
            "of one key (If-None-Match: *), so writers committing at once (sinks, the projector, "
            "compaction, loadgens) would overwrite each other's commits without an error; use an S3 "
            "store that enforces it (AWS S3, SeaweedFS: `trajlake s3 up`)",
            table_uri=storage.root,
        )


def _refuses_second_put(storage: Storage) -> bool:
    """Put one scratch object twice with `If-None-Match: *`; True if the store refused the second."""
    client = _client(storage)
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = storage.root.removeprefix("s3://").partition("/")
    key = f"{prefix}/{PROBE_PREFIX}/{uuid.uuid4().hex}".lstrip("/")
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
        except ClientError as err:
            if err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
                return True  # PreconditionFailed, or ConditionalRequestConflict while the first settles
            raise
        log.warning("%s: a second put-if-absent of one key replaced the first", store_name(storage))
        return False
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "AccessDenied":
            raise LakeError(_write_denied(storage), table_uri=storage.root) from None
        raise LakeError(storage.unreachable(OSError(str(err))), table_uri=storage.root) from None
    except BotoCoreError as err:  # unreachable, no such bucket, credentials refused
        raise LakeError(storage.unreachable(OSError(str(err))), table_uri=storage.root) from None
    finally:
        with contextlib.suppress(BotoCoreError, ClientError):
            client.delete_object(Bucket=bucket, Key=key)


def _write_denied(storage: Storage) -> str:
    """What to fix when the store refused the probe's put: the key may read, not write."""
    key = {k.upper(): v for k, v in storage.options.items()}.get("AWS_ACCESS_KEY_ID", "(none)")
    return (
        f"cannot write the lake at {storage.root}: {store_name(storage)} refused a put (AccessDenied) "
        f"to the S3 identity AWS_ACCESS_KEY_ID={key}, which has no Write permission there; writing "
        "takes a key with Write rights (a `trajlake stack`'s writer key is in its env/writer.env)"
    )


def _client(storage: Storage) -> Any:
    """A boto3 S3 client with the lake's endpoint and credentials (the `AWS_*` options delta-rs gets)."""
    try:
        import boto3
    except ImportError:
        raise LakeError(
            f"writing the lake at {storage.root} first checks its store with boto3, which is not "
            "installed: pip install 'trajlake[s3]'",
            table_uri=storage.root,
        ) from None
    o = {k.upper(): v for k, v in storage.options.items()}
    names = {"AWS_ENDPOINT_URL": "endpoint_url", "AWS_ACCESS_KEY_ID": "aws_access_key_id",
             "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key", "AWS_SESSION_TOKEN": "aws_session_token",
             "AWS_REGION": "region_name"}  # fmt: skip
    return boto3.client("s3", **{arg: o[key] for key, arg in names.items() if o.get(key)})
