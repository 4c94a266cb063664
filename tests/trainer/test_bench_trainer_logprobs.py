"""bench/trainer_logprobs.py runs in quick mode and writes its figures (no assertion on speed)."""

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
        [sys.executable, str(ROOT / "bench" / "trainer_logprobs.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["batches"] > 0 and figures["values_kept"] > 0
    assert figures["kept_raw_bytes"] == 4 * figures["values_kept"]
    assert figures["ratio"] == pytest.approx(figures["keeping_s"] / figures["plain_s"])
    assert "step time, keeping / plain" in proc.stdout
