"""Small builders shared by tests (imported as `tests.helpers`)."""

from __future__ import annotations

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
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the `trajlake` CLI in a subprocess, as a user would."""
    cmd = [sys.executable, "-c", "from trajlake.cli import run; run()", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
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
