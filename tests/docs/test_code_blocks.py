"""Every Python, shell and SQL block of the docs runs as written, in page order, against the lake a
reader has after `trajlake demo`: the docs cannot rot without a test failing.

Each page runs in a directory of its own holding `./trajlake-data` (a copy of one demo lake, runs
`demo` and `demo-overfit`); its Python blocks share one namespace, as a reader's session would.
The demo lake comes from `--engine tiny` (seconds, no server), which records no tokenizer, so
`detokenize()` and the browser decode with the tiny chat model (`TRAJLAKE_TOKENIZER`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import blocks as md

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
PAGES = [p for p in md.pages() if any(b.kind and b.not_run is None for b in md.blocks(p))]


def _run_shell(block: md.Block, work: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{block.where}: exit {done.returncode}\n{block.code}\n--- stdout\n{done.stdout[-3000:]}\n"
        f"--- stderr\n{done.stderr[-3000:]}"
    )


def _run_sql(block: md.Block, capsys: pytest.CaptureFixture[str]) -> None:
    from trajlake.cli import main

    capsys.readouterr()
    code = main(["sql", "--lake", "trajlake-data", "--format", "json", block.code])
    out, err = capsys.readouterr()
    assert code == 0, f"{block.where}: exit {code}\n{block.code}\n{err}"
    assert json.loads(out), f"{block.where}: the query answers nothing on the demo lake\n{block.code}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(md.ROOT)))
def test_every_block_of_the_page_runs_as_written(
    page: Path,
    tiny_demo_lake: Path,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    work = tmp_path / "work"
    shutil.copytree(tiny_demo_lake, work / "trajlake-data")
    monkeypatch.chdir(work)
    monkeypatch.setenv("TRAJLAKE_TOKENIZER", str(model_dir))
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in md.blocks(page):
        if block.kind is None or block.not_run is not None:
            continue
        if block.save_as is not None:
            (work / block.save_as).write_text(block.code)  # the later block that runs it checks it
        elif block.kind == "python":
            exec(compile(block.code, block.where, "exec"), namespace)
        elif block.kind == "shell":
            _run_shell(block, work)
        else:
            _run_sql(block, capsys)
