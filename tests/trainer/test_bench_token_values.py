"""bench/token_values.py runs in quick mode, writes its figures and checks its ratio against the
committed baseline (measured side by side in one run: no assertion on speed)."""

from __future__ import annotations

import pytest

from tests.helpers import quick_bench


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_writes_side_by_side_figures(tmp_path):
    printed, figures = quick_bench("token_values", tmp_path, "--check")
    assert figures["batches"] > 0 and figures["tokens"] >= figures["trained_tokens"] > 0
    assert figures["portable_bytes_per_token"] == pytest.approx(figures["portable_bytes"] / figures["tokens"])
    assert figures["ratio"] == pytest.approx(figures["keeping_s"] / figures["plain_s"])
    assert "step time, keeping / plain" in printed and "bytes per token" in printed
    assert "check ratio:" in printed and "REGRESSED" not in printed
