"""bench/sampler.py runs in quick mode and writes its figures (no assertion on speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_writes_side_by_side_figures(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sampler.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["tokens_handed_out"] > 0 and figures["batches"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["sampler_tokens_per_s"] / figures["plain_duckdb_tokens_per_s"]
    )
    assert "ratio sampler/plain" in proc.stdout
