"""The wheel a user installs holds every module and data file of the package, and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_PACKAGED = {"tests", "bench", "scripts", "docs", "docker", "examples", "build", "dist"}


@pytest.mark.integration  # builds the wheel in a process
def test_the_wheel_holds_every_module_migration_and_page(tmp_path: Path) -> None:
    # a copy without build outputs: setuptools would reuse a stale build/ folder of the checkout
    source = tmp_path / "source"
    junk = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".*", "trajlake-data")
    shutil.copytree(ROOT, source, ignore=junk)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        check=True,
        capture_output=True,
        cwd=source,
    )
    (wheel,) = tmp_path.glob("trajlake-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    sources = {
        "trajlake/" + path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if path.suffix in (".py", ".mako")
        and path.relative_to(ROOT).parts[0] not in NOT_PACKAGED
        and not any(
            part.startswith(".") or part.endswith(".egg-info") for part in path.relative_to(ROOT).parts
        )
    }
    assert "trajlake/store/migrations/versions/0001_initial.py" in sources
    assert sources - names == set(), "modules missing from the wheel: add their folder to [tool.setuptools]"
    packaged = {n for n in names if n.startswith("trajlake/")}
    assert {n.split("/")[1] for n in packaged} & NOT_PACKAGED == set()
