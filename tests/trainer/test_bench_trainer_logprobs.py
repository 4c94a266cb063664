"""bench/trainer_logprobs.py runs in quick mode and writes its figures (no assertion on speed)."""

from __future__ import annotations

import pytest

from tests.helpers import quick_bench


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_writes_side_by_side_figures(tmp_path):
    printed, figures = quick_bench("trainer_logprobs", tmp_path)
    assert figures["batches"] > 0 and figures["values_kept"] > 0
    assert figures["kept_raw_bytes"] == 4 * figures["values_kept"]
    assert figures["ratio"] == pytest.approx(figures["keeping_s"] / figures["plain_s"])
    assert "step time, keeping / plain" in printed
