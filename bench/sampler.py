"""Sampler throughput vs a plain DuckDB read of the same rows.

    python bench/sampler.py [--quick] [--json PATH] [--check]

Records a synthetic run (loadgen) into a temporary lake, then measures side by side:
  - sampler: `Sampler.next_batch` (select fresh groups, lease them in the SQLite catalog,
    read their token payloads, pack micro-batches) plus building each micro-batch's padded
    tensors, until the run is used up; tokens handed out per second;
  - plain: for the same batches, `select token_ids, logprobs, loss_mask from trajectories
    where trajectory_id in (...)` into Arrow with DuckDB; tokens per second;
and reports ratio = sampler / plain (goal: >= 0.5). It also times the sampler reading
tokens through the `trajectories` view instead of `events` (`sampler_view`).
"""

from __future__ import annotations

import os
import statistics
import time

from harness import Bench, run


def build_lake(root: str, trajectories: int) -> dict[str, int]:
    """A loadgen run in a fresh lake; return its counts."""
    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.loadgen import LoadgenConfig, generate
    from trajlake.store.lake import Lake

    bus = InProcessBus()
    counts = generate(bus, LoadgenConfig(run_id="bench", trajectories=trajectories, seed=7))
    lake = Lake(root)
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    lake.close()
    return {"trajectories": counts.trajectories, "tokens": counts.tokens}


def run_sampler(root: str, reader: str, catalog_file: str) -> tuple[float, list[list[str]], int]:
    """Hand out the whole run; return (seconds, ids per batch, tokens)."""
    from trajlake.store.catalog import Catalog
    from trajlake.store.lake import Lake
    from trajlake.trainer.config import SamplerConfig
    from trajlake.trainer.sampler import Sampler

    lake = Lake(root)
    catalog = Catalog(f"sqlite:///{catalog_file}")
    config = SamplerConfig(
        run_id="bench", max_staleness=10**6, group_wait_s=0, groups_per_batch=8, drop_zero_variance=False,
        micro_batch_tokens=32_768, token_reader=reader,
    )  # fmt: skip
    sampler = Sampler(lake, catalog, config)
    import torch  # noqa: F401 - imported by Batch.tensors: load it before the clock starts

    lake.query_engine()  # both sides open their DuckDB engine untimed
    batches: list[list[str]] = []
    tokens = 0
    started = time.perf_counter()
    step = 0
    while (batch := sampler.next_batch(trainer_version=0, step=step)) is not None:
        for indices in batch.micro_batches:
            batch.tensors(indices)
        batches.append(batch.trajectory_ids)
        tokens += batch.n_tokens
        catalog.mark_consumed("bench", batch.trajectory_ids, sampler.owner, step)
        step += 1
    seconds = time.perf_counter() - started
    catalog.close()
    lake.close()
    return seconds, batches, tokens


def run_plain(root: str, batches: list[list[str]]) -> tuple[float, int]:
    """Read the same rows, batch by batch, with one DuckDB query each into Arrow."""
    import pyarrow.compute as pc

    from trajlake.store.lake import Lake
    from trajlake.store.sql import placeholders

    lake = Lake(root)
    lake.query_engine()
    tokens = 0
    started = time.perf_counter()
    for ids in batches:
        table = lake.sql(
            f"select token_ids, logprobs, loss_mask from trajectories where trajectory_id in ({placeholders(len(ids))})",
            list(ids),
        )
        tokens += int(pc.sum(pc.list_value_length(table.column("token_ids"))).as_py() or 0)
    seconds = time.perf_counter() - started
    lake.close()
    return seconds, tokens


def main(argv: list[str] | None = None) -> int:
    bench = Bench("sampler", __doc__, ratios={"ratio": "higher"})
    bench.parser.add_argument("--repeats", type=int, default=None, help="timed repetitions (median reported)")
    args = bench.parse(argv)
    n = 192 if args.quick else 1024
    repeats = args.repeats or (1 if args.quick else 3)

    with bench.scratch() as work:
        root = os.path.join(work, "lake")
        counts = build_lake(root, n)
        run_plain(root, [[]])  # warm the OS cache and DuckDB's first-use costs
        sampler_tps, view_tps, plain_tps = [], [], []
        handed = 0
        for r in range(repeats):
            seconds, batches, tokens = run_sampler(root, "events", os.path.join(work, f"catalog-{r}.db"))
            plain_s, plain_tokens = run_plain(root, batches)
            view_s, _, view_tokens = run_sampler(root, "view", os.path.join(work, f"catalog-view-{r}.db"))
            assert plain_tokens == tokens == view_tokens, (plain_tokens, tokens, view_tokens)
            sampler_tps.append(tokens / seconds)
            plain_tps.append(plain_tokens / plain_s)
            view_tps.append(view_tokens / view_s)
            handed = tokens
    result = {
        "quick": args.quick,
        "trajectories_in_run": counts["trajectories"],
        "tokens_handed_out": handed,
        "batches": len(batches),
        "repeats": repeats,
        "sampler_tokens_per_s": statistics.median(sampler_tps),
        "plain_duckdb_tokens_per_s": statistics.median(plain_tps),
        "sampler_view_tokens_per_s": statistics.median(view_tps),
    }
    result["ratio"] = result["sampler_tokens_per_s"] / result["plain_duckdb_tokens_per_s"]
    result["ratio_view_reader"] = result["sampler_view_tokens_per_s"] / result["plain_duckdb_tokens_per_s"]
    result["goal_ratio"] = 0.5
    return bench.finish(
        args,
        result,
        f"sampler (events reader): {result['sampler_tokens_per_s']:,.0f} tokens/s into packed micro-batches\n"
        f"sampler (view reader):   {result['sampler_view_tokens_per_s']:,.0f} tokens/s\n"
        f"plain DuckDB read:       {result['plain_duckdb_tokens_per_s']:,.0f} tokens/s (same rows, into Arrow)\n"
        f"ratio sampler/plain:     {result['ratio']:.2f} (goal >= 0.5); view reader {result['ratio_view_reader']:.2f}\n"
        f"{result['tokens_handed_out']:,} tokens in {result['batches']} batches from {n} trajectories",
    )


if __name__ == "__main__":
    run(main)
