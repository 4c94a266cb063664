"""Small builders shared by tests (imported as `tests.helpers`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trajlake.schemas import events as ev


def turn_event(run_id: str = "r", trajectory_id: str = "t", seq: int = 1, **overrides: Any) -> dict[str, Any]:
    """A valid `turn` event; override any field to break it."""
    fields: dict[str, Any] = {
        "trajectory_id": trajectory_id,
        "seq": seq,
        "turn_index": 0,
        "policy_version": 0,
        "input_token_ids": [1, 2, 3],
        "output_token_ids": [4, 5],
        "output_logprobs": [-0.1, -0.2],
        "loss_mask": [True, True],
        "vocab_size": 100,
    }
    fields.update(overrides)
    return ev.make_event(ev.TURN, run_id, **fields)


def started_event(run_id: str = "r", trajectory_id: str = "t", **overrides: Any) -> dict[str, Any]:
    """A valid `trajectory_started` event at seq 0."""
    fields: dict[str, Any] = {
        "trajectory_id": trajectory_id,
        "seq": 0,
        "task_id": "task",
        "group_id": "g",
        "sample_index": 0,
    }
    fields.update(overrides)
    return ev.make_event(ev.TRAJECTORY_STARTED, run_id, **fields)


def trajlake(
    *args: str, env: dict[str, str] | None = None, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `trajlake` CLI in a subprocess, as a user would."""
    cmd = [sys.executable, "-c", "from trajlake.cli import run; run()", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(
            f"trajlake {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


def quick_bench(name: str, tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """Run `bench/<name>.py --quick --json [args]` (no assertion on speed); return its stdout and figures."""
    import json

    out = tmp_path / f"{name}.json"
    script = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def framework_venv(name: str) -> Path:
    """The venv of RL framework `name` (scripts/framework-venv.sh: cached after the first build)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "framework-venv.sh"
    done = subprocess.run([str(script), name], capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise AssertionError(f"building the {name} venv failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def clean_env(home: Any, **env: str) -> dict[str, str]:
    """A minimal environment for a CLI subprocess: PATH, HOME=`home`, plus `env` (no inherited TRAJLAKE_*, AWS_*)."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), **env}


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s` (no fixed sleeps in tests)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (Linux /proc; zombies have none)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def stored_trajectories(lake_root: Path, run: str) -> dict[str, dict[str, Any]]:
    """Trajectory id -> its `trajectories` row plus the started event's `tags` and `attributes` (parsed),
    its `turns` (events, in order), `tools` (tool_calls rows) and `finished_events` (how many ended it),
    read with a fresh Lake, as a user would query it."""
    import json

    from trajlake.store.lake import Lake

    lake = Lake(lake_root)
    try:
        params = {"run": run}
        rows = lake.sql(
            "select t.*, s.tags, s.attributes from trajectories t join events s using (trajectory_id) "
            "where s.event_type = 'trajectory_started' and t.run_id = $run",
            params,
        ).to_pylist()
        turns = lake.sql(
            "select trajectory_id, turn_index, input_token_ids, output_token_ids, output_logprobs, loss_mask, "
            "tito_drift, policy_version, attributes from events where event_type = 'turn' and run_id = $run "
            "order by turn_index",
            params,
        ).to_pylist()
        ends = lake.sql(
            "select trajectory_id, count(*) as n from events where event_type = 'trajectory_finished' "
            "and run_id = $run group by trajectory_id",
            params,
        ).to_pylist()
        tools = lake.sql(
            "select trajectory_id, tool_name, ok from tool_calls where run_id = $run", params
        ).to_pylist()
    finally:
        lake.close()
    finished = {r["trajectory_id"]: r["n"] for r in ends}
    out = {}
    for row in rows:
        tid = row["trajectory_id"]
        row["attributes"] = json.loads(row["attributes"]) if row["attributes"] else {}
        row["turns"] = [t for t in turns if t["trajectory_id"] == tid]
        row["tools"] = [t for t in tools if t["trajectory_id"] == tid]
        row["finished_events"] = finished.get(tid, 0)
        out[tid] = row
    return out


def run_json_script(
    python: Path, script: Path, *args: str, env: dict[str, str], timeout: float
) -> dict[str, Any]:
    """Run `script ARGS` with `python` (a framework venv's); return the JSON object it prints last."""
    import json

    import pytest

    done = subprocess.run([str(python), str(script), *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=env)  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"{script.name} {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # a framework may print progress before it


def same_floats(a: Any, b: Any) -> bool:
    """The two sequences hold the same float32 values (logprobs as the lake stores them)."""
    import numpy as np

    return bool(np.array_equal(np.array(a, dtype=np.float32), np.array(b, dtype=np.float32)))


def age_log(log: Path, hours: float) -> None:
    """Date every entry of a `_delta_log` `hours` back, as if its commits were that old."""
    then = time.time() - hours * 3600
    for entry in log.iterdir():
        os.utime(entry, (then, then))


def tampered_copy(
    root: Path, to: Path, table: str, column: str, change: Callable[[dict[str, Any]], Any]
) -> Path:
    """A copy of the lake at `root` whose `table` has `change(row)` as each row's `column` (the record doctored)."""
    import shutil

    import pyarrow as pa

    from trajlake.store.lake import Lake

    shutil.copytree(root, to)
    lake = Lake(to)
    try:
        stored = lake.read(table)
        field = stored.schema.field(column)
        values = pa.array([change(row) for row in stored.to_pylist()], field.type)
        lake.overwrite(table, stored.set_column(stored.schema.get_field_index(column), field, values))
    finally:
        lake.close()
    return to
