"""Store write benchmark: the lake's write path next to raw Parquet and JSONL, on the same data.

Measures, for one synthetic run (default 2,000 trajectories x ~8K tokens):
  * store throughput: messages -> decode -> validate -> Parquet -> Delta commit, then the
    projections' catch-up as a lagging projector does it (reading the new files back), and a
    sink projecting each batch from the rows it wrote (its default);
  * raw `pyarrow.parquet.write_table` (zstd) of the same Arrow events, and the ratio;
  * bytes stored per token, counting every file of every table of the lake;
  * the same run as JSONL (one record per trajectory, as verl/SkyRL/AReaL dump rollouts):
    its size, and one aggregate computed from it next to the same aggregate in DuckDB.

    python bench/store_write.py [--quick] [--json PATH] [--check]
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from harness import Bench, run

from trajlake.cli import tune_malloc
from trajlake.ingest import codec
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store import projections
from trajlake.store.lake import Lake


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "_delta_log" not in f.parts)


def sink_into(lake: Lake, messages: list, update_projections: bool) -> float:
    """Seconds for a sink to commit `messages` into `lake` in one batch (projecting it or not)."""
    replay = InProcessBus()
    for m in messages:
        replay.send(codec_message(m))
    config = SinkConfig(
        max_rows=10**7, max_bytes=1 << 40, max_latency_s=3600, update_projections=update_projections
    )
    sink = DeltaSink(lake, replay, config)
    t0 = time.perf_counter()
    while replay.pending():
        sink.poll_once()
    sink.flush()
    return time.perf_counter() - t0


def jsonl_records(events: pa.Table) -> list[dict]:
    """One record per trajectory: the whole token sequence, logprobs, mask, reward, status."""
    by_traj: dict[str, dict] = {}
    for e in events.to_pylist():
        tid = e["trajectory_id"]
        if tid is None:
            continue
        r = by_traj.setdefault(
            tid,
            {
                "trajectory_id": tid,
                "prompt_token_ids": [],
                "response_ids": [],
                "rollout_logprobs": [],
                "loss_mask": [],
                "reward": None,
                "status": None,
            },
        )
        if e["event_type"] == "turn":
            inp = e["input_token_ids"] or []
            r["response_ids"] += inp + e["output_token_ids"]
            r["rollout_logprobs"] += [0.0] * len(inp) + e["output_logprobs"]
            r["loss_mask"] += [0] * len(inp) + [int(m) for m in e["loss_mask"]]
            r["policy_version"] = e["policy_version"]
        elif e["event_type"] == "reward":
            r["reward"] = e["reward"]
        elif e["event_type"] == "trajectory_finished":
            r["status"] = e["status"]
    return list(by_traj.values())


def main(argv: list[str] | None = None) -> int:
    bench = Bench(
        "store_write", __doc__, ratios={"lake_vs_raw_zstd_bytes": "lower", "jsonl_over_lake_size": "higher"}
    )
    bench.parser.add_argument("--trajectories", type=int, default=None, help="200 quick, 2,000 full")
    bench.parser.add_argument("--repeats", type=int, default=3, help="timings are the best of this many runs")
    args = bench.parse(argv)
    n = args.trajectories or (200 if args.quick else 2000)
    config = LoadgenConfig(
        trajectories=n,
        run_id="bench",
        turns=8,
        max_turns=32,
        prompt_tokens=1024,
        output_tokens=640,
        env_tokens=320,
        context_budget_tokens=65_536,
        seed=1,
    )

    bus = InProcessBus()
    counts = generate(bus, config)
    messages = bus.poll(max_messages=10**9, timeout_s=0)
    tables = [codec.decode(m.value, m.headers)[0] for m in messages]
    events = pa.concat_tables(tables)
    print(
        f"run: {counts.trajectories} trajectories, {counts.events} events, {counts.tokens:,} tokens, "
        f"{len(messages)} messages"
    )

    with bench.scratch() as tmp:
        root = Path(tmp)
        # raw Parquet on the same Arrow data; every timing is the best of `repeats` runs,
        # since on a shared 2-core machine single runs vary by +-30%
        raw_s = raw_zstd_s = store_s = project_s = inline_s = float("inf")
        for i in range(args.repeats):
            t0 = time.perf_counter()
            pq.write_table(events, root / "raw.parquet")  # pyarrow's defaults (snappy)
            raw_s = min(raw_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            pq.write_table(events, root / "raw-zstd.parquet", compression="zstd")
            raw_zstd_s = min(raw_zstd_s, time.perf_counter() - t0)

            # the store: the same messages through the sink into a fresh lake, projections
            # off, then caught up as a lagging projector does (reading the new files back)
            lake = Lake(root / f"lake-{i}")
            store_s = min(store_s, sink_into(lake, messages, update_projections=False))
            t0 = time.perf_counter()
            projections.catch_up(lake)
            project_s = min(project_s, time.perf_counter() - t0)
            # and as a sink runs by default: projecting each batch from the rows it just wrote
            inline = Lake(root / f"inline-{i}")
            inline_s = min(inline_s, sink_into(inline, messages, update_projections=True))
            inline.close()
            shutil.rmtree(root / f"inline-{i}", ignore_errors=True)  # its projector may still be letting go
            if i < args.repeats - 1:
                lake.close()
                shutil.rmtree(root / f"lake-{i}")
        raw_bytes = (root / "raw.parquet").stat().st_size
        raw_zstd_bytes = (root / "raw-zstd.parquet").stat().st_size
        lake_root = root / f"lake-{args.repeats - 1}"
        lake_bytes = dir_bytes(lake_root)
        stored = lake.sql("select count(*) from events").column(0)[0].as_py()
        assert stored == events.num_rows, (stored, events.num_rows)

        # JSONL, the format RL frameworks dump
        records = jsonl_records(events)
        t0 = time.perf_counter()
        with open(root / "rollouts.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        jsonl_write_s = time.perf_counter() - t0
        jsonl_bytes = (root / "rollouts.jsonl").stat().st_size

        t0 = time.perf_counter()
        agg: dict[str, list[float]] = {}
        with open(root / "rollouts.jsonl") as f:
            for line in f:
                r = json.loads(line)
                a = agg.setdefault(r["status"], [0, 0.0, 0])
                a[0] += 1
                a[1] += r["reward"] or 0.0
                a[2] += len(r["response_ids"])
        jsonl_query_s = time.perf_counter() - t0
        query = (
            "select status, count(*), sum(coalesce(reward, 0)), sum(total_tokens) "
            "from trajectories group by status"
        )
        lake.sql(query)  # warm the view registration once, as a dashboard would
        t0 = time.perf_counter()
        lake.sql(query)
        duck_query_s = time.perf_counter() - t0
        lake.close()

    tokens = counts.tokens
    figures = {
        "quick": args.quick,
        "trajectories": counts.trajectories,
        "events": counts.events,
        "tokens": tokens,
        "store_s": store_s,
        "store_tokens_per_s": tokens / store_s,
        "store_mb_per_s": events.nbytes / store_s / 1e6,
        "raw_parquet_s": raw_s,
        "raw_parquet_tokens_per_s": tokens / raw_s,
        "ratio": raw_s / store_s,
        "projection_s": project_s,
        "store_with_projections_tokens_per_s": tokens / (store_s + project_s),
        "ratio_with_projections": raw_s / (store_s + project_s),
        "sink_with_projections_s": inline_s,
        "ratio_sink_with_projections": raw_s / inline_s,
        "raw_parquet_zstd_s": raw_zstd_s,
        "ratio_vs_zstd": raw_zstd_s / store_s,
        "raw_parquet_zstd_bytes_per_token": raw_zstd_bytes / tokens,
        "lake_bytes": lake_bytes,
        "lake_bytes_per_token": lake_bytes / tokens,
        "raw_parquet_bytes_per_token": raw_bytes / tokens,
        "lake_vs_raw_zstd_bytes": lake_bytes / raw_zstd_bytes,  # every table against the events alone
        "jsonl_bytes": jsonl_bytes,
        "jsonl_bytes_per_token": jsonl_bytes / tokens,
        "jsonl_over_lake_size": jsonl_bytes / lake_bytes,
        "jsonl_write_s": jsonl_write_s,
        "jsonl_query_s": jsonl_query_s,
        "duckdb_query_s": duck_query_s,
        "query_speedup": jsonl_query_s / duck_query_s,
    }
    lines: list[str] = []
    lines.append(
        f"store write:      {figures['store_tokens_per_s']:>14,.0f} tokens/s ({store_s:.2f} s, "
        f"{figures['store_mb_per_s']:.0f} MB/s of Arrow)"
    )
    lines.append(
        f"+ projections:    {figures['store_with_projections_tokens_per_s']:>14,.0f} tokens/s "
        f"(catch-up {project_s:.2f} s; ratio {figures['ratio_with_projections']:.2f})"
    )
    lines.append(
        f"sink projecting:  {tokens / inline_s:>14,.0f} tokens/s ({inline_s:.2f} s, the default: each batch "
        f"projected from the rows it wrote; ratio {figures['ratio_sink_with_projections']:.2f})"
    )
    lines.append(f"raw parquet:      {figures['raw_parquet_tokens_per_s']:>14,.0f} tokens/s ({raw_s:.2f} s)")
    lines.append(f"raw parquet zstd: {tokens / raw_zstd_s:>14,.0f} tokens/s ({raw_zstd_s:.2f} s)")
    lines.append(
        f"ratio store/raw:  {figures['ratio']:.2f} vs defaults, {figures['ratio_vs_zstd']:.2f} vs zstd  (goal >= 0.8)"
    )
    lines.append(
        f"lake bytes/token: {figures['lake_bytes_per_token']:.2f}  (all tables; raw parquet "
        f"{figures['raw_parquet_bytes_per_token']:.2f}, zstd {figures['raw_parquet_zstd_bytes_per_token']:.2f}; goal <= 6)"
    )
    lines.append(
        f"JSONL:            {jsonl_bytes / 1e6:.1f} MB = {figures['jsonl_over_lake_size']:.1f}x the lake (goal >= 4)"
    )
    lines.append(
        f"aggregate:        JSONL {jsonl_query_s * 1000:.0f} ms vs DuckDB on the lake {duck_query_s * 1000:.1f} ms "
        f"= {figures['query_speedup']:.0f}x (goal >= 20)"
    )
    return bench.finish(args, figures, "\n".join(lines))


def codec_message(m):  # a fresh copy without its old position
    from trajlake.ingest.bus.base import Message

    return Message(key=m.key, value=m.value, headers=dict(m.headers))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    tune_malloc()  # the lake is written as in a `trajlake` process
    run(main)
