"""bench/sampler.py runs in quick mode, writes its figures and checks its ratio against the committed
baseline (measured side by side in one run: no assertion on speed)."""

from __future__ import annotations

import pytest

from tests.helpers import quick_bench


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_writes_side_by_side_figures(tmp_path):
    printed, figures = quick_bench("sampler", tmp_path, "--check")
    assert figures["tokens_handed_out"] > 0 and figures["batches"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["sampler_tokens_per_s"] / figures["plain_duckdb_tokens_per_s"]
    )
    assert "ratio sampler/plain" in printed
    assert "check ratio:" in printed and "REGRESSED" not in printed
