"""The stack's process records: a pid another process reused is never taken for the one started."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import trajlake
from trajlake.deploy.processes import Process
from trajlake.deploy.stack import Stack


def _started(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_a_record_whose_pid_was_reused_is_not_alive_and_stopping_it_signals_nothing() -> None:
    me = os.getpid()
    assert Process("sink-1", me, _started(me), "sink-1.log").is_alive()
    reused = Process("sink-1", me, _started(me) + 1, "sink-1.log")  # same pid, another start time
    assert not reused.is_alive()
    assert reused.stop() is False  # and this process is still here to assert it


def test_demo_on_a_directory_without_a_stack_says_how_to_start_one(tmp_path: Path) -> None:
    out = trajlake("demo", "--stack", str(tmp_path), "--engine", "tiny", check=False)
    assert out.returncode == 2
    assert f"no stack in {tmp_path}" in out.stderr and "trajlake stack up --dir" in out.stderr


def test_demo_on_a_stack_refuses_another_lake(tmp_path: Path) -> None:
    Stack(
        tmp_path, envs={"demo": {"TRAJLAKE_LAKE": "s3://trajlake/lake", "TRAJLAKE_KAFKA": "127.0.0.1:1"}}
    ).save()
    saved = json.loads((tmp_path / "stack.json").read_text())["envs"]
    assert saved["demo"]["TRAJLAKE_LAKE"] == "s3://trajlake/lake"
    out = trajlake(
        "demo", "--stack", str(tmp_path), "--lake", str(tmp_path / "other"), "--engine", "tiny", check=False
    )
    assert out.returncode == 2
    assert "brings its own lake and Kafka; drop --lake" in out.stderr
