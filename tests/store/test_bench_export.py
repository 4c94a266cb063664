"""bench/export.py runs in quick mode, writes its figures and checks its ratio against the committed
baseline (measured side by side in one run: no assertion on speed)."""

from __future__ import annotations

import pytest

from tests.helpers import quick_bench


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_writes_side_by_side_figures_and_holds_its_baseline(tmp_path):
    printed, figures = quick_bench("export", tmp_path, "--check")
    assert figures["rows_exported"] > 0 and figures["tokens_exported"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["export_tokens_per_s"] / figures["plain_duckdb_copy_tokens_per_s"]
    )
    assert "check ratio:" in printed and "REGRESSED" not in printed
