"""Ingest benchmark: Kafka -> one sink process -> Delta, measured side by side in one run.

Figures (all on the same synthetic workload, generated once):
  - pipeline: producer process -> Kafka -> sink (this process) -> committed Delta rows,
    events/s, tokens/s and MB/s of wire bytes, exactly-once on;
  - raw: the same events written straight to one Parquet file with pyarrow (the floor);
  - the same pipeline with exactly-once off (no txn actions, no fencing, no resume), and the
    same difference per sink batch (write + commit, alternating on one table), where the noise
    of two whole pipeline runs cancels out;
  - freshness: p50/p95 from an event being sent to it being visible to `lake.sql`;
  - efficiency: wire bytes per token as the broker stores them (its log size for the topic,
    after producer compression, record and batch framing included) next to the lake's bytes per
    token (the events table's data files), and the sink's CPU seconds per GB of events (Arrow
    bytes) while it drains a backlog, next to a plain pyarrow.parquet write of the same rows;
    the same two figures for lz4 and zstd, one trajectory per message or packed (`variants`).
Ratios: pipeline / raw throughput (best runs), and exactly-once overhead = 1 - off / on
(medians). Each pipeline run also reports the CPU seconds of the sink, the producer and
(when the bench started it) the broker: on a small machine their sum over the cores is a
floor under the wall time that no sink change can beat. `--check` guards the two figures that
hold across machines and load: the sink's CPU per GB against the raw write's, and the topic's
bytes per token against the lake's (a quick run's wall-time ratios swing with whatever else the
machine runs).

    python bench/ingest.py [--quick] [--json PATH] [--check]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from harness import Bench, run

from trajlake.cli import tune_malloc
from trajlake.common.procs import cpu_seconds
from trajlake.ingest import codec
from trajlake.ingest.bus.base import Message, Packing
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.bus.kafka_admin import create_topic
from trajlake.ingest.bus.kafka_client import kafka_partition_of
from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.schemas import make_event
from trajlake.store.lake import Lake

_MESSAGES: list[Message] = []  # inherited by forked producer processes
# compared side by side on one backlog: name -> (producer compression, packed messages)
VARIANTS = {
    "lz4": ("lz4", False),
    "zstd": ("zstd", False),
    "lz4_packed": ("lz4", True),
    "zstd_packed": ("zstd", True),
}


class _KafkaShaped(InProcessBus):
    """Collects messages as a `KafkaPublisher` on a topic of the default partition count sends them:
    packed per partition up to `pack_bytes` (0: one trajectory per message)."""

    def __init__(self, pack_bytes: int) -> None:
        super().__init__(topic="bench")
        self.pack_bytes = pack_bytes

    def packing(self) -> Packing | None:
        partitions = range(KafkaConfig.model_fields["partitions"].default)
        return Packing(kafka_partition_of(partitions), self.pack_bytes) if self.pack_bytes else None


PACKED_BYTES = KafkaConfig.model_fields["pack_bytes"].default
"""The pack size of the `*_packed` variants when --pack-bytes is 0."""


def workload(trajectories: int, pack_bytes: int = 0) -> tuple[list[Message], pa.Table, int]:
    """Encoded messages (as producers send them), the decoded events, and the token count."""
    bus = _KafkaShaped(pack_bytes)
    generate(bus, LoadgenConfig(trajectories=trajectories, run_id="bench", seed=1))
    messages = [m for log in bus._logs for m in log]
    tables = [codec.decode(m.value, m.headers)[0] for m in messages]
    events = pa.concat_tables(tables).combine_chunks()
    tokens = sum(
        int(pc.sum(pc.list_value_length(events.column(c))).as_py() or 0)
        for c in ("input_token_ids", "output_token_ids")
    )
    return messages, events, tokens


def cpu_now() -> float:
    """User + system CPU seconds of this process so far, all its threads (pyarrow's and Rust's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_parquet(events: pa.Table, workdir: Path) -> tuple[float, float]:
    """Seconds and CPU seconds to write `events` as one Parquet file with the lake's layout
    options, no pipeline."""
    lake = Lake(workdir / "raw-options")
    options = lake.writer.parquet_options(events.schema)
    start, cpu = time.perf_counter(), cpu_now()
    pq.write_table(events, workdir / "raw.parquet", **options)
    return time.perf_counter() - start, cpu_now() - cpu


def topic_bytes(config: KafkaConfig) -> int:
    """Bytes the brokers hold for the topic (one replica per partition): the record batches as the
    producer compressed them, keys, headers and framing included, which is what every consumer
    fetches. (kafka-python's producer reports only byte rates, no `outgoing-byte-total`, and those
    count request framing and metadata too; the broker's log size is exact and client-neutral.)"""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(**config.client_kwargs())
    try:
        answers = admin.describe_log_dirs([config.topic])
    finally:
        admin.close()
    sizes: dict[int, int] = {}
    for broker in answers:
        for log_dir in broker["log_dirs"]:
            for topic in log_dir["topics"]:
                if topic["name"] == config.topic:
                    for part in topic["partitions"]:
                        index = part["partition_index"]
                        sizes[index] = max(sizes.get(index, 0), part["partition_size"])
    return sum(sizes.values())


def table_bytes(path: Path) -> int:
    """Bytes of a Delta table's data files (its log left out, as in bench/store_write.py)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "_delta_log" not in f.parts)


def commit_cost(events: pa.Table, workdir: Path, batches: int) -> dict[str, float]:
    """Median seconds per batch to write and commit `events` in `batches` parts, with and without
    exactly-once (txn actions plus the fenced, re-checked commit), alternating on one table."""
    lake = Lake(workdir / "commit-cost")
    parts = [events.slice(i * events.num_rows // batches, events.num_rows // batches) for i in range(batches)]
    lake.commit("events", lake.write_files("events", parts[0]))  # create the table outside the clock
    times: dict[bool, list[float]] = {True: [], False: []}
    last: int | None = None
    for i, part in enumerate(parts[1:]):
        exactly_once = i % 2 == 0
        start = time.perf_counter()
        actions = lake.write_files("events", part)
        if exactly_once:
            lake.commit("events", actions, {"bench:0": i}, expect_txns={"bench:0": last})
            last = i
        else:
            lake.commit("events", actions)
        times[exactly_once].append(time.perf_counter() - start)
    lake.close()
    on, off = float(np.median(times[True])), float(np.median(times[False]))
    return {"exactly_once_s": round(on, 4), "plain_s": round(off, 4), "overhead": round(1 - off / on, 3)}


def _produce(config: KafkaConfig, start_at: float, report: Any) -> None:
    while time.time() < start_at:
        time.sleep(0.001)
    bus = KafkaPublisher(config)
    for message in _MESSAGES:
        bus.send(Message(message.key, message.value, dict(message.headers)))
    bus.close()
    report.put((time.time() - start_at, time.process_time()))  # a forked child's CPU clock starts at 0


@dataclass
class Run:
    """One timed pipeline run: wall seconds and the CPU seconds each process spent."""

    seconds: float
    producer_s: float  # when the producer had everything acknowledged
    cpu: dict[str, float | None]
    topic_bytes: int  # what the broker stores for the topic
    producer_cpu_s: float
    lake_bytes: int  # the events table's data files


def pipeline(
    bootstrap: str,
    workdir: Path,
    exactly_once: bool,
    total: int,
    compression: str,
    broker_pid: int | None,
    backlog: bool = False,
    messages: list[Message] | None = None,
) -> Run:
    """Seconds from the first send to the last event committed, one sink, exactly-once on or off.

    With `backlog`, everything is produced first and the clock runs from the sink's first
    poll: how fast one sink drains a backlog with the machine to itself.
    """
    name = f"bench-{uuid.uuid4().hex[:8]}"
    config = KafkaConfig(
        bootstrap=bootstrap, topic=name, group_id=name, spool_dir=workdir / "spool", compression=compression
    )
    create_topic(config)
    lake = Lake(workdir / name)
    bus = KafkaSubscriber(config)
    sink = DeltaSink(lake, bus, SinkConfig(exactly_once=exactly_once, update_projections=False))
    while not bus.assigned_partitions():  # join the group before the clock starts
        sink.poll_once()
    global _MESSAGES
    _MESSAGES = messages if messages is not None else _MESSAGES
    start_at = time.time() + 0.5
    ctx = mp.get_context("fork")
    report = ctx.Queue()
    producer = ctx.Process(target=_produce, args=(config, start_at, report))
    producer.start()
    if backlog:
        producer_s, producer_cpu = report.get(timeout=120)
        start_at = time.time()
    # the producer and broker are other processes: this process's CPU is the sink's (the consumer's
    # network thread included) and, with `backlog`, only the sink's
    sink_cpu, broker_cpu = cpu_now(), cpu_seconds(broker_pid)
    while sink.stats.events < total:
        sink.poll_once()
        if sink.should_flush():
            sink.flush(wait=False)  # as `trajlake ingest` does: commit while consuming on
    sink.flush()
    end = sink.stats.last_commit_at or time.time()
    sink_cpu = cpu_now() - sink_cpu
    broker_end = cpu_seconds(broker_pid)
    if not backlog:
        producer_s, producer_cpu = report.get(timeout=60)
    producer.join()
    bus.close()
    stored = lake.sql("select count(*) as n from events").to_pylist()[0]["n"]
    lake.close()
    lake_bytes = table_bytes(workdir / name / "events")
    if stored != total:
        raise SystemExit(f"pipeline stored {stored} events, expected {total}")
    cpu = {
        "sink": sink_cpu,
        "producer": None if backlog else producer_cpu,
        "broker": broker_end - broker_cpu if broker_end is not None and broker_cpu is not None else None,
    }
    return Run(end - start_at, producer_s, cpu, topic_bytes(config), producer_cpu, lake_bytes)


def _trickle(config: KafkaConfig, n: int, rate: float) -> None:
    bus = KafkaPublisher(config)
    for i in range(n):
        tid = str(uuid.uuid4())
        bus.publish(
            [
                make_event(
                    "trajectory_started",
                    "fresh",
                    trajectory_id=tid,
                    seq=0,
                    task_id=f"t{i}",
                    group_id="g",
                    sample_index=0,
                )
            ]
        )
        bus.flush()
        time.sleep(1.0 / rate)
    bus.close()


def freshness(bootstrap: str, workdir: Path, n: int, rate: float) -> list[float]:
    """Seconds from each event's creation (event_time, set at send) to its first visibility in lake.sql."""
    name = f"fresh-{uuid.uuid4().hex[:8]}"
    config = KafkaConfig(bootstrap=bootstrap, topic=name, group_id=name, spool_dir=workdir / "spool")
    create_topic(config)
    lake = Lake(workdir / name)
    bus = KafkaSubscriber(config)
    sink = DeltaSink(lake, bus, SinkConfig())  # defaults: flush every 1 s, projections on
    while not bus.assigned_partitions():
        sink.poll_once()
    producer = mp.get_context("fork").Process(target=_trickle, args=(config, n, rate))
    producer.start()
    seen: dict[str, float] = {}
    lags: list[float] = []
    while len(seen) < n:
        sink.poll_once()
        if sink.should_flush() and sink.flush() is not None:
            rows = lake.sql("select event_id, epoch_us(event_time) as t from events").to_pylist()
            now = time.time()
            for row in rows:
                if row["event_id"] not in seen:
                    seen[row["event_id"]] = now
                    lags.append(now - row["t"] / 1e6)
    producer.join()
    bus.close()
    lake.close()
    return lags


def main(argv: list[str] | None = None) -> int:
    bench = Bench(
        "ingest", __doc__, ratios={"sink_cpu_per_gb_vs_raw": "lower", "wire_vs_lake_bytes": "lower"}
    )
    parser = bench.parser
    parser.add_argument("--trajectories", type=int, help="workload size (default 300 quick, 2000 full)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="throughput is the best, overhead the median, of this many runs (1 quick, 5 full)",
    )
    parser.add_argument(
        "--compression",
        default=KafkaConfig.model_fields["compression"].default,
        choices=["auto", "zstd", "lz4", "gzip", "none"],
        help="producer batch compression (default: the KafkaConfig default)",
    )
    parser.add_argument(
        "--pack-bytes",
        type=int,
        default=KafkaConfig.model_fields["pack_bytes"].default,
        help="trajectories of one partition share a message up to this size, 0: one per message "
        "(default: the KafkaConfig default)",
    )
    args = bench.parse(argv)
    trajectories = args.trajectories or (300 if args.quick else 2000)
    args.repeats = args.repeats or (1 if args.quick else 5)

    global _MESSAGES
    # the same trajectories (one seed) as KafkaPublisher sends them with these settings, and one per message
    _MESSAGES, events, tokens = workload(trajectories, args.pack_bytes)
    single, single_events, _ = workload(trajectories)
    assert single_events.num_rows == events.num_rows
    main_messages = _MESSAGES
    wire_mb = sum(len(m.value) for m in _MESSAGES) / 1e6
    total = events.num_rows
    print(
        f"workload: {total} events, {tokens} tokens, {len(_MESSAGES)} messages "
        f"({len(single)} one trajectory each), {wire_mb:.1f} MB on the wire before compression"
    )

    from trajlake.ingest.broker import BrokerConfig, free_port, node_pids, start_broker, stop_broker

    with bench.scratch() as tmp:
        workdir = Path(tmp)
        bootstrap = os.environ.get("TRAJLAKE_KAFKA_BOOTSTRAP")
        broker_dir = None
        if not bootstrap:
            broker_dir = workdir / "broker"
            bootstrap = start_broker(BrokerConfig(port=free_port(), data_dir=broker_dir))
        broker_pid = node_pids(broker_dir).get(1) if broker_dir is not None else None
        try:
            # best of `repeats`: single runs on a shared 2-core machine vary by tens of percent
            # at least 5: a quick run's raw write takes a fraction of a CPU second, noisy alone
            raw_runs = [raw_parquet(events, workdir) for _ in range(max(5, args.repeats))]
            raw_s = min(seconds for seconds, _ in raw_runs)
            per_commit = commit_cost(events, workdir, 21 if args.quick else 41)
            on_runs, off_runs, drain_runs = [], [], []
            for _ in range(args.repeats):  # interleaved, so drift in load hits both modes alike
                on_runs.append(
                    pipeline(
                        bootstrap, workdir, True, total, args.compression, broker_pid, messages=main_messages
                    )
                )
                off_runs.append(
                    pipeline(
                        bootstrap, workdir, False, total, args.compression, broker_pid, messages=main_messages
                    )
                )
                drain_runs.append(
                    pipeline(
                        bootstrap,
                        workdir,
                        True,
                        total,
                        args.compression,
                        broker_pid,
                        backlog=True,
                        messages=main_messages,
                    )
                )
            # the codecs side by side on the same backlog: bytes on the wire against CPU at both ends
            # and packed against one trajectory per message
            packed = workload(trajectories, args.pack_bytes or PACKED_BYTES)[0]
            codec_runs: dict[str, list[Run]] = {c: [] for c in VARIANTS}
            for _ in range(args.repeats):
                for name, (c, pack) in VARIANTS.items():
                    codec_runs[name].append(
                        pipeline(
                            bootstrap,
                            workdir,
                            True,
                            total,
                            c,
                            broker_pid,
                            backlog=True,
                            messages=packed if pack else single,
                        )
                    )
            _MESSAGES = main_messages
            lags = freshness(bootstrap, workdir, 40 if args.quick else 150, 20.0)
        finally:
            if broker_dir is not None:
                stop_broker(broker_dir)

    def rates(seconds: float) -> dict[str, float]:
        return {
            "seconds": round(seconds, 3),
            "events_per_s": round(total / seconds, 1),
            "tokens_per_s": round(tokens / seconds, 1),
            "mb_per_s": round(wire_mb / seconds, 2),
        }

    best_on = min(on_runs, key=lambda r: r.seconds)
    best_drain = min(drain_runs, key=lambda r: r.seconds)
    on_s, off_s = best_on.seconds, min(r.seconds for r in off_runs)
    # the overhead compares medians: a best-of-N difference of two noisy minima swings by +-15 %
    on_median = float(np.median([r.seconds for r in on_runs]))
    off_median = float(np.median([r.seconds for r in off_runs]))
    cpu = {name: round(v, 3) for name, v in best_on.cpu.items() if v is not None}
    # efficiency, per GB of events as Arrow holds them in memory (the same rows for both writers);
    # CPU medians: CPU seconds vary less than wall time, but other tenants still slow a core down
    gb = events.nbytes / 1e9
    sink_cpu_per_gb = float(np.median([r.cpu["sink"] or 0.0 for r in drain_runs])) / gb
    raw_cpu_per_gb = float(np.median([cpu_s for _, cpu_s in raw_runs])) / gb
    drained = drain_runs[0]  # every run carries the same workload; sizes barely differ between runs
    efficiency = {
        "events_gb": round(gb, 4),
        "topic_bytes": drained.topic_bytes,
        "lake_bytes": drained.lake_bytes,
        "uncompressed_bytes_per_token": round(wire_mb * 1e6 / tokens, 3),
        "sink_cpu_s_per_gb": round(sink_cpu_per_gb, 3),
        "raw_parquet_cpu_s_per_gb": round(raw_cpu_per_gb, 3),
    }
    result = {
        "workload": {
            "events": total,
            "tokens": tokens,
            "messages": len(_MESSAGES),
            "messages_one_trajectory_each": len(single),
            "pack_bytes": args.pack_bytes,
            "wire_mb": round(wire_mb, 2),
        },
        "pipeline_exactly_once": rates(on_s),
        "pipeline_no_exactly_once": rates(off_s),
        "raw_parquet": rates(raw_s),
        "ratio": round(raw_s / on_s, 3),
        # the same sink draining a backlog produced beforehand, so it has the cores to itself
        "backlog_drain": {
            **rates(best_drain.seconds),
            "ratio": round(raw_s / best_drain.seconds, 3),
            "cpu_s": {k: round(v, 3) for k, v in best_drain.cpu.items() if v is not None},
        },
        "exactly_once_overhead": round(1 - off_median / on_median, 3),
        "median_seconds": {"exactly_once": round(on_median, 3), "no_exactly_once": round(off_median, 3)},
        # the same cost measured where it arises, per sink batch: noise of whole runs cancels out
        "exactly_once_per_commit": per_commit,
        "freshness_s": {
            "p50": round(float(np.percentile(lags, 50)), 3),
            "p95": round(float(np.percentile(lags, 95)), 3),
        },
        "compression": KafkaConfig(compression=args.compression).compression_type() or "none",
        # goals (issue 17): wire <= 1.5 x lake bytes/token; sink CPU per GB <= 3 x the raw write's
        "wire_bytes_per_token": round(drained.topic_bytes / tokens, 3),
        "lake_bytes_per_token": round(drained.lake_bytes / tokens, 3),
        "sink_cpu_per_gb_vs_raw": round(sink_cpu_per_gb / raw_cpu_per_gb, 3),
        "wire_vs_lake_bytes": round(drained.topic_bytes / drained.lake_bytes, 3),
        "efficiency": efficiency,
        "variants": {
            c: {
                "wire_bytes_per_token": round(runs[0].topic_bytes / tokens, 3),
                "sink_cpu_s_per_gb": round(float(np.median([r.cpu["sink"] or 0.0 for r in runs])) / gb, 3),
                "sink_cpu_per_gb_vs_raw": round(
                    float(np.median([r.cpu["sink"] or 0.0 for r in runs])) / gb / raw_cpu_per_gb, 3
                ),
                "producer_cpu_s_per_gb": round(float(np.median([r.producer_cpu_s for r in runs])) / gb, 3),
                "drain_events_per_s": round(total / min(r.seconds for r in runs), 1),
            }
            for c, runs in codec_runs.items()
        },
        # where the best exactly-once run spent its time: when the producer was done, and the CPU
        # seconds of each process; their sum over the cores bounds the wall time from below
        "best_run": {
            "producer_done_s": round(best_on.producer_s, 3),
            "cpu_s": cpu,
            "cpu_bound_s": round(sum(cpu.values()) / (os.cpu_count() or 1), 3),
        },
        "cpu_count": os.cpu_count(),
        "quick": args.quick,
    }
    lines = [
        f"pipeline {result['pipeline_exactly_once']['events_per_s']:.0f} events/s = {result['ratio']:.2f} x raw Parquet; "
        f"exactly-once overhead {result['exactly_once_overhead']:.1%} end to end, "
        f"{per_commit['overhead']:.1%} per batch commit; "
        f"freshness p50 {result['freshness_s']['p50']} s, p95 {result['freshness_s']['p95']} s; "
        f"CPU s {cpu} over {os.cpu_count()} cores; "
        f"draining a backlog: {result['backlog_drain']['events_per_s']:.0f} events/s = "
        f"{result['backlog_drain']['ratio']:.2f} x raw Parquet",
        f"wire {result['wire_bytes_per_token']:.2f} B/token on the topic "
        f"({efficiency['uncompressed_bytes_per_token']:.2f} before compression) vs lake {result['lake_bytes_per_token']:.2f} B/token "
        f"= {result['wire_bytes_per_token'] / result['lake_bytes_per_token']:.2f} x; "
        f"sink CPU {sink_cpu_per_gb:.1f} s/GB vs raw Parquet {raw_cpu_per_gb:.1f} s/GB = "
        f"{result['sink_cpu_per_gb_vs_raw']:.2f} x",
    ]
    for c, f in result["variants"].items():
        lines.append(
            f"  {c}: wire {f['wire_bytes_per_token']:.2f} B/token, sink CPU {f['sink_cpu_s_per_gb']:.1f} s/GB "
            f"({f['sink_cpu_per_gb_vs_raw']:.2f} x raw), producer CPU {f['producer_cpu_s_per_gb']:.1f} s/GB, "
            f"drain {f['drain_events_per_s']:.0f} events/s"
        )
    return bench.finish(args, result, "\n".join(lines))


if __name__ == "__main__":
    tune_malloc()  # the sink runs as in a `trajlake` process
    run(main)
