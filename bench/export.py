"""`trajlake export` throughput vs a plain DuckDB `COPY … TO parquet` of the same rows.

    python bench/export.py [--quick] [--json PATH] [--check]

Records a synthetic run (loadgen) into a temporary lake, then measures side by side:
  - export: `trajlake.store.export.export` of `select run_id, trajectory_id, reward, n_turns
    from trajectories where status = 'completed'` to Parquet (token ids, logprobs, loss mask
    added; no tokenizer, so no text); tokens written per second;
  - plain: DuckDB `COPY (the same select with token_ids, logprobs, loss_mask) TO 'file.parquet'`
    over the same views, same thread count; tokens per second;
and reports ratio = export / plain (goal: >= 0.5).
"""

from __future__ import annotations

import io
import os
import statistics
import time

from harness import Bench, run

QUERY = "select run_id, trajectory_id, reward, n_turns from trajectories where status = 'completed'"
PLAIN = (
    "select run_id, trajectory_id, reward, n_turns, token_ids, logprobs, loss_mask "
    "from trajectories where status = 'completed'"
)


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


def run_export(root: str, out: str) -> tuple[float, int, int]:
    """Export the selection to Parquet; return (seconds, rows, tokens written)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from trajlake.store.config import ExportSettings
    from trajlake.store.export import export
    from trajlake.store.lake import Lake

    lake = Lake(root)
    lake.query_engine()  # both sides open their DuckDB database untimed
    settings = ExportSettings(sql=QUERY, format="parquet", out=out, force=True)
    started = time.perf_counter()
    report = export(lake, settings, stream=io.StringIO())
    seconds = time.perf_counter() - started
    lake.close()
    table = pq.read_table(out, columns=["token_ids"])
    return seconds, report.rows, int(pc.sum(pc.list_value_length(table.column("token_ids"))).as_py() or 0)


def run_plain(root: str, path: str) -> tuple[float, int, int]:
    """DuckDB COPY of the same rows (same views, same threads); return (seconds, rows, tokens)."""
    import duckdb
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from trajlake.store.lake import TABLES, Lake
    from trajlake.store.reads import register_tables, tune
    from trajlake.store.sql import TRAJECTORY_TOKENS_SQL, TURN_TOKENS_SQL, VIEWS

    lake = Lake(root)
    con = duckdb.connect()
    tune(con)  # as the lake's query engine
    register_tables(con, lake, TABLES)
    con.execute("create view _trajectory_tokens as " + TRAJECTORY_TOKENS_SQL)
    con.execute("create view _turn_tokens as " + TURN_TOKENS_SQL)
    for name in TABLES:
        con.execute(f"create view {name} as {VIEWS.get(name, f'select * from _t_{name}')}")
    started = time.perf_counter()
    con.execute(f"copy ({PLAIN}) to '{path}' (format parquet, compression zstd)")
    seconds = time.perf_counter() - started
    con.close()
    lake.close()
    table = pq.read_table(path, columns=["token_ids"])
    tokens = int(pc.sum(pc.list_value_length(table.column("token_ids"))).as_py() or 0)
    return seconds, table.num_rows, tokens


def main(argv: list[str] | None = None) -> int:
    bench = Bench("export", __doc__, ratios={"ratio": "higher"})
    bench.parser.add_argument("--repeats", type=int, default=None, help="timed repetitions (median reported)")
    args = bench.parse(argv)
    n = 512 if args.quick else 4096
    repeats = args.repeats or (1 if args.quick else 3)

    with bench.scratch() as work:
        root = os.path.join(work, "lake")
        counts = build_lake(root, n)
        run_plain(root, os.path.join(work, "warm.parquet"))  # warm the OS cache and DuckDB's first-use costs
        export_tps, plain_tps = [], []
        rows = tokens = 0
        for r in range(repeats):
            seconds, rows, tokens = run_export(root, os.path.join(work, f"export-{r}"))
            plain_s, plain_rows, plain_tokens = run_plain(root, os.path.join(work, f"plain-{r}.parquet"))
            assert (plain_rows, plain_tokens) == (rows, tokens), (plain_rows, plain_tokens, rows, tokens)
            export_tps.append(tokens / seconds)
            plain_tps.append(plain_tokens / plain_s)
    result = {
        "quick": args.quick,
        "trajectories_in_run": counts["trajectories"],
        "rows_exported": rows,
        "tokens_exported": tokens,
        "repeats": repeats,
        "export_tokens_per_s": statistics.median(export_tps),
        "plain_duckdb_copy_tokens_per_s": statistics.median(plain_tps),
    }
    result["ratio"] = result["export_tokens_per_s"] / result["plain_duckdb_copy_tokens_per_s"]
    result["goal_ratio"] = 0.5
    return bench.finish(
        args,
        result,
        f"trajlake export:     {result['export_tokens_per_s']:,.0f} tokens/s to Parquet\n"
        f"plain DuckDB COPY:   {result['plain_duckdb_copy_tokens_per_s']:,.0f} tokens/s (same rows, same columns)\n"
        f"ratio export/plain:  {result['ratio']:.2f} (goal >= 0.5)\n"
        f"{rows:,} trajectories, {tokens:,} tokens, of {counts['trajectories']} in the run",
    )


if __name__ == "__main__":
    run(main)
