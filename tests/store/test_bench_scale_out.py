"""bench/scale_out.py runs in quick mode on a small backlog: every run (each design, a local lake and
one in S3, 1 and 2 sinks) stores the whole topic, and its ratios are the figures side by side; a
stream into each lake reports how soon a produced trajectory is visible in SQL (no assertion on speed)."""

from __future__ import annotations

import pytest

from tests.helpers import quick_bench


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_drains_the_backlog_into_a_local_and_an_s3_lake_with_1_and_2_sinks(
    tmp_path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAJLAKE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    printed, figures = quick_bench("scale_out", tmp_path, "--trajectories", "200", "--stream", "60")
    runs = {(r["design"], r["lake"], r["sinks"]): r for r in figures["runs"]}
    assert set(runs) == {(d, lake, n) for d, lake in (("before", "local"), ("projector", "local"),
                                                      ("projector", "s3")) for n in (1, 2)}  # fmt: skip
    assert {(r["events"], r["tokens"]) for r in runs.values()} == {(runs["before", "local", 1]["events"],
                                                                    runs["before", "local", 1]["tokens"])}  # fmt: skip
    for n in (1, 2):
        s3, local = runs["projector", "s3", n], runs["projector", "local", n]
        assert s3["projector_cpu_s"] > 0 and s3["freshness_p99_s"] >= s3["freshness_p50_s"] > 0
        assert figures[f"s3_{n}_sinks"] == pytest.approx(
            s3["events_per_sink_cpu_s"] / local["events_per_sink_cpu_s"]
        )
    assert "S3 lake / local lake (events per sink CPU-s): 1 sinks" in printed
    streams = {(r["lake"], r["sinks"]): r for r in figures["streams"]}
    assert set(streams) == {(lake, n) for lake in ("local", "s3") for n in (1, 2)}
    assert all(r["visible_max_s"] >= r["visible_p99_s"] >= r["visible_p50_s"] > 0 for r in streams.values())
    assert "produce -> visible in SQL (60 trajectories at 20/s" in printed
