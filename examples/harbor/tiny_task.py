"""A tiny Harbor task (instruction, tests/test.sh that writes the reward) for the host environment.

    make_task(Path("tasks"))  # -> tasks/tiny-task

The test script names the reward file relative to itself, so the same task runs in a container
(`/tests/../logs/verifier/reward.txt`) and on trajlake's host environment (the scratch dir).
"""

from __future__ import annotations

from pathlib import Path

INSTRUCTION = "Create a file named hello.txt in the current directory that contains the word hello.\n"
TEST_SCRIPT = """#!/bin/bash
if grep -q hello hello.txt 2>/dev/null; then r=1; else r=0; fi
echo $r > "$(dirname "$0")/../logs/verifier/reward.txt"
"""
TASK_TOML = """schema_version = "1.4"
[verifier]
timeout_sec = 60.0
environment_mode = "shared"
[agent]
timeout_sec = 300.0
[environment]
build_timeout_sec = 60.0
"""


def make_task(root: Path, name: str = "tiny-task") -> Path:
    """Write the task under `root`; return its directory."""
    task = root / name
    for sub in ("tests", "environment"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (task / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\n"
    )  # not built on the host
    (task / "instruction.md").write_text(INSTRUCTION)
    (task / "tests" / "test.sh").write_text(TEST_SCRIPT)
    (task / "task.toml").write_text(TASK_TOML)
    return task
