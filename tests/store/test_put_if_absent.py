"""A lake refuses to write where its object store would let two writers commit one version: the real
SeaweedFS passes; the same server behind a proxy that drops `If-None-Match` is refused, before
anything is written, by the library, every writing command, and `doctor`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from tests.fixtures.s3 import create_bucket
from tests.fixtures.s3_proxy import s3_proxy
from tests.helpers import clean_env, trajlake
from trajlake.schemas import events_to_table, make_event
from trajlake.store.errors import UnsafeStore
from trajlake.store.lake import Lake
from trajlake.store.put_if_absent import PROBE_PREFIX, check_store

pytestmark = pytest.mark.integration


@pytest.fixture
def unsafe_store(s3_server: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The env of the session's SeaweedFS reached through a proxy that drops `If-None-Match`."""
    with s3_proxy(s3_server, tmp_path / "proxy.log", drop_headers=frozenset({"if-none-match"})) as proxy:
        yield {**s3_server, "AWS_ENDPOINT_URL": proxy.endpoint}


def _events(n: int = 3):
    return events_to_table([make_event("policy_updated", "r", policy_version=v, step=v) for v in range(n)])


def test_seaweedfs_refuses_a_second_put_if_absent_and_the_probe_leaves_nothing(s3_lake_root: str) -> None:
    lake = Lake(s3_lake_root)
    check = check_store(lake.storage)
    assert check is not None and check.safe, check
    assert "refuses a second put-if-absent" in check.describe()
    lake.append("events", _events())
    assert lake.sql("select count(*) as n from events").to_pylist() == [{"n": 3}]
    fs, root = lake.filesystem()
    left = fs.get_file_info(pafs.FileSelector(f"{root}/{PROBE_PREFIX}", allow_not_found=True, recursive=True))
    assert [info.path for info in left if info.type == pafs.FileType.File] == []
    lake.close()


def test_a_store_that_ignores_if_none_match_is_refused_before_anything_is_written(
    unsafe_store: dict[str, str], s3_server: dict[str, str]
) -> None:
    root = f"s3://{create_bucket(s3_server)}/lake"
    lake = Lake(root, storage_options=unsafe_store)
    with pytest.raises(
        UnsafeStore, match=rf"refusing to write the lake at {root}: .* accepted a second put-if-absent"
    ):
        lake.append("events", _events())
    with pytest.raises(UnsafeStore):  # every later write too, without probing again
        lake.delta("trajectories")
    assert not Lake(root, storage_options=s3_server).holds_tables()  # no table was created


def test_writing_commands_refuse_an_unsafe_store_and_doctor_fails_it(
    unsafe_store: dict[str, str], s3_server: dict[str, str], tmp_path: Path
) -> None:
    root = f"s3://{create_bucket(s3_server)}/lake"
    safe, unsafe = clean_env(tmp_path, **s3_server), clean_env(tmp_path, **unsafe_store)
    refused = trajlake("loadgen", "--lake", root, "--trajectories", "5", env=unsafe, check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert f"trajlake loadgen: error: refusing to write the lake at {root}" in refused.stderr
    assert "SeaweedFS: `trajlake s3 up`" in refused.stderr and "Traceback" not in refused.stderr

    trajlake("loadgen", "--lake", root, "--run-id", "r", "--trajectories", "5", env=safe)
    doctor = ("doctor", "--lake", root, "--run", "r", "--format", "json")
    report = json.loads(trajlake(*doctor, env=safe, check=False).stdout)
    assert (
        report["storage"]["safe"] is True and "refuses a second put-if-absent" in report["storage"]["detail"]
    )
    failed = trajlake(*doctor[:-2], env=unsafe, check=False)
    assert failed.returncode == 1
    assert "accepted a second put-if-absent of one key" in failed.stdout
    assert "FAIL: " in failed.stdout and "concurrent writers lose commits" in failed.stdout.split("FAIL: ")[1]


def test_doctor_of_a_local_lake_says_its_filesystem_is_safe(lake: Lake, tmp_path: Path) -> None:
    trajlake("loadgen", "--lake", lake.root, "--run-id", "r", "--trajectories", "5", env=clean_env(tmp_path))
    out = trajlake("doctor", "--lake", lake.root, "--run", "r", env=clean_env(tmp_path), check=False).stdout
    assert "storage          a local directory" in out
