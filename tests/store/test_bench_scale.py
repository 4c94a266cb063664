"""bench/scale.py grows a run through the ingest path and writes every figure per size (no assertion on speed)."""

from __future__ import annotations

import pytest

from tests.helpers import quick_bench
from trajlake.dashboards.app import PAGES


@pytest.mark.integration  # a benchmark process: two small sizes, every page rendered at each
@pytest.mark.slow
def test_the_scale_bench_reports_each_figure_at_each_size_and_its_growth(tmp_path):
    printed, figures = quick_bench("scale", tmp_path, "--sizes", "3e5,1e6")
    sizes = figures["sizes_tokens"]
    assert len(sizes) == 2 and 3e5 <= sizes[0] < sizes[1]
    for name in ("point_lookup_warm_s", "point_lookup_cold_s", "catch_up_s", "sampler_batch_s",
                 "sampler_empty_catalog_s", "sampler_next_batch_s", "slowest_page_s", "slowest_sql_s",
                 "peak_rss_mb", "lake_bytes_per_token", "search_tokens_s", "search_tokens_per_s"):  # fmt: skip
        values = figures["figures"][name]
        assert len(values) == 2 and all(v > 0 for v in values), name
        assert figures["growth"][name] == pytest.approx(values[1] / values[0]), name
    assert {f"page_{page}_s" for page in PAGES} <= set(figures["figures"])
    phases = [figures["figures"][f"rss_{p}_mb"] for p in ("ingest", "read", "rebuild", "compact")]
    assert [max(each) for each in zip(*phases, strict=True)] == figures["figures"]["peak_rss_mb"]
    assert figures["figures"]["trajectories"][1] > figures["figures"]["trajectories"][0]
    assert (
        figures["long"]["tokens"] / figures["long"]["trajectories"]
        > 5 * sizes[0] / figures["figures"]["trajectories"][0]
    )
    assert "growth" in printed and "point_lookup_warm_s" in printed
