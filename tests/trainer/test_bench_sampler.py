"""bench/sampler.py runs in quick mode and writes its figures (no assertion on speed)."""

from __future__ import annotations

import pytest

from tests.helpers import quick_bench


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_writes_side_by_side_figures(tmp_path):
    printed, figures = quick_bench("sampler", tmp_path)
    assert figures["tokens_handed_out"] > 0 and figures["batches"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["sampler_tokens_per_s"] / figures["plain_duckdb_tokens_per_s"]
    )
    assert "ratio sampler/plain" in printed
