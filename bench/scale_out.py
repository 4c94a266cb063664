"""Scale-out benchmark: sinks that only ingest plus one projector, against the design before it (every
sink projects after each of its commits), side by side on the same backlog; and the same scale-out
design on a lake in S3 (a SeaweedFS server the run starts) against one in a local directory.

For 1 and 2 sink processes in one consumer group on a 4-partition topic, each run drains the
same backlog (produced first) into a fresh lake, in commits of 2,000 events, until the lake holds
the topic's end and the projections hold every events commit. Figures per run:
  - events per sink CPU-second (every sink process's user + system time; the projector's apart);
  - events/s over the wall time, from the sinks' first poll to the projections caught up;
  - races: catch-ups started over because another writer moved a projection's position first
    (before: every sink projects, so sinks race each other), and events commits tried again;
  - freshness p50/p99: from an events commit to the projection commit that made it visible.
Then a stream for each lake (local, S3) and sink count: a producer sends trajectories at a steady
pace (`--rate` a second) while the sinks and the projector run as a deployment runs them (the sinks'
default flush), and a SQL user polls `trajectories`: produce -> visible in SQL p50/p99, from a
trajectory's last event leaving the producer to the first query that returns it.
`--stack DIR` runs that stream through a running `trajlake stack` instead (its TLS Kafka as the
producer principal, its sinks and projector, its S3 lake read with the reader's key), beside the
same stream into one sink and a local lake.
Ratios at each sink count: events per sink CPU-second, sinks + projector / before (local lakes);
and s3 / local for sinks + projector (what the object store's round trips cost a sink).

    python bench/scale_out.py [--quick] [--json PATH] [--check] [--stack DIR]
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import os
import resource
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import Bench, run

RUNS = (("before", False), ("projector", False), ("projector", True))
"""(design, on S3) of each run at each sink count, interleaved: drift in the machine's load hits all alike."""
SINKS = (1, 2)
BUCKET = "bench"
BATCH_EVENTS = 2_000
POLL_S = 0.2
"""How often the stream's SQL user looks for new trajectories (a figure is at most this late)."""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _freshness(lake: Any, after: int, upto: int, into: list[float]) -> None:
    now = time.time()
    into.extend(max(0.0, now - t) for t in lake.log.commit_times("events", after, upto).values())


def _sink(
    bootstrap: str,
    topic: str,
    root: str,
    spool: Path,
    design: str,
    out: Any,
    stop: Any = None,
    ready: Any = None,
) -> None:
    """One sink process: drain the topic into the lake; `before` also projects after every commit.
    With `stop` (an event), a deployment's sink instead: default flush, said on `ready` once it holds
    partitions, running until `stop` is set."""
    from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
    from trajlake.ingest.config import KafkaConfig
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.schemas.tables import PROJECTION_TABLES
    from trajlake.store import projections
    from trajlake.store.compact import merge_tiers
    from trajlake.store.lake import Lake

    lake = Lake(root)
    config = KafkaConfig(bootstrap=bootstrap, topic=topic, group_id=topic, spool_dir=spool)
    bus = KafkaSubscriber(config)
    races = {"positions": 0}
    fresh: list[float] = []

    class ProjectingSink(DeltaSink):
        """The design before: after each events commit, the sink catches every projection up (from
        the rows it just wrote) and merges their files by size tier."""

        def _commit(self, p: Any, result: Any, offsets: Any) -> int:
            written: dict[str, Any] = {}
            write = lake.write_files

            def capture(name: str, data: Any) -> Any:
                actions = write(name, data)
                written.update({a.path: data for a in actions})
                return actions

            lake.write_files = capture  # type: ignore[method-assign]
            try:
                version = super()._commit(p, result, offsets)
            finally:
                del lake.write_files
            after = min(-1 if v is None else v for v in
                        (lake.txn_version(n, projections.APP_ID) for n in PROJECTION_TABLES))  # fmt: skip
            upto = projections.catch_up(
                lake, written, on_retry=lambda: races.__setitem__("positions", races["positions"] + 1)
            )
            _freshness(lake, after, upto, fresh)
            for name in PROJECTION_TABLES:
                merge_tiers(lake, name, 10)
            return version

    kind = ProjectingSink if design == "before" else DeltaSink
    if stop is not None:
        sink = kind(lake, bus, SinkConfig(update_projections=False))
    else:  # a commit per 2,000 events, as a stream of small batches makes them: what the sinks contend over
        sink = kind(lake, bus, SinkConfig(update_projections=False, max_latency_s=0.5, max_rows=BATCH_EVENTS))
    retries0 = lake.commits.races
    cpu0, start = _cpu(), time.time()
    if stop is not None:
        while not bus.assigned_partitions():
            sink.poll_once()
        ready.put(os.getpid())
        sink.run(stop_event=stop)
    else:
        sink.run(until_idle_s=1.0)
    out.put({"events": sink.stats.events, "cpu_s": _cpu() - cpu0, "start": start, "end": time.time(),
             "position_races": races["positions"], "commit_races": lake.commits.races - retries0,
             "freshness": fresh})  # fmt: skip
    bus.close()


def _projector(root: str, sinks_done: Any, out: Any) -> None:
    """The projector process: follow `events` until the sinks are done and every commit is projected."""
    from trajlake.store.lake import Lake
    from trajlake.store.projector import Projector

    lake = Lake(root)
    projector = Projector(lake)
    cpu0 = _cpu()
    projector.take_over()
    while True:
        stepped = projector.step()
        if sinks_done.is_set() and not stepped and projector.position() >= lake.version("events"):
            break
        if not stepped:
            time.sleep(0.1)
    projector.release()
    out.put({"cpu_s": _cpu() - cpu0, "end": time.time(), "position_races": projector.stats.position_retries,
             "freshness": list(projector.stats.freshness_s)})  # fmt: skip


def produce(bootstrap: str, workdir: Path, trajectories: int) -> tuple[str, Any]:
    """A fresh 4-partition topic holding the backlog; return its name and its counts (events, tokens)."""
    from trajlake.ingest.bus.kafka_admin import create_topic
    from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
    from trajlake.ingest.config import KafkaConfig
    from trajlake.rollout.loadgen import LoadgenConfig, generate

    topic = f"scale-out-{uuid.uuid4().hex[:8]}"
    config = KafkaConfig(bootstrap=bootstrap, topic=topic, group_id=topic, spool_dir=workdir / "spool")
    create_topic(config)
    bus = KafkaPublisher(config)
    counts = generate(bus, LoadgenConfig(trajectories=trajectories, run_id="bench", seed=1))
    bus.close()
    if bus.spool_stats().messages:
        raise SystemExit(f"{bus.spool_stats().messages} messages did not reach Kafka at {bootstrap}")
    return topic, counts


def drain(
    bootstrap: str, workdir: Path, trajectories: int, design: str, sinks: int, bucket: str | None
) -> dict[str, Any]:
    """One run: the backlog drained by `sinks` sink processes of `design` into a lake in `bucket` (S3)
    or, without one, in `workdir`; its figures."""
    from trajlake.store.lake import Lake

    topic, counts = produce(bootstrap, workdir, trajectories)
    total = counts.events
    root = f"s3://{bucket}/{topic}" if bucket else str(workdir / topic)
    Lake(root)
    ctx = mp.get_context("spawn")  # the children inherit the S3 settings from this process's environment
    out, done = ctx.Queue(), ctx.Event()
    args = (bootstrap, topic, root, workdir / topic / "spool", design, out)
    procs = [ctx.Process(target=_sink, args=args) for _ in range(sinks)]
    projector = ctx.Process(target=_projector, args=(root, done, out)) if design == "projector" else None
    for proc in [*procs, *([projector] if projector else [])]:
        proc.start()
    reports = [out.get(timeout=1800) for _ in procs]
    done.set()
    projected = out.get(timeout=1800) if projector else None
    for proc in [*procs, *([projector] if projector else [])]:
        proc.join()
    lake = Lake(root)
    stored = lake.sql("select count(*) as n from events").to_pylist()[0]["n"]
    if stored != total:
        raise SystemExit(f"{design} with {sinks} sink(s) stored {stored} events, expected {total}")
    sink_cpu = sum(r["cpu_s"] for r in reports)
    end = max([r["end"] for r in reports] + ([projected["end"]] if projected else []))
    fresh = sorted(projected["freshness"] if projected else [f for r in reports for f in r["freshness"]])
    return {
        "design": design,
        "lake": "s3" if bucket else "local",
        "sinks": sinks,
        "events": total,
        "tokens": counts.tokens,
        "sink_cpu_s": sink_cpu,
        "events_per_sink_cpu_s": total / sink_cpu,
        "tokens_per_sink_cpu_s": counts.tokens / sink_cpu,
        "events_per_s": total / (end - min(r["start"] for r in reports)),
        "projector_cpu_s": projected["cpu_s"] if projected else None,
        "position_races": sum(r["position_races"] for r in reports)
        + (projected["position_races"] if projected else 0),
        "commit_races": sum(r["commit_races"] for r in reports),
        "freshness_p50_s": statistics.median(fresh) if fresh else None,
        "freshness_p99_s": fresh[math.ceil(0.99 * len(fresh)) - 1] if fresh else None,
    }


class _Paced:
    """A publisher that sends at most `rate` messages a second (a producer's steady pace)."""

    def __init__(self, bus: Any, rate: float) -> None:
        self.bus, self.interval, self.next = bus, 1.0 / rate, time.monotonic()

    def send(self, message: Any) -> None:
        self.bus.send(message)
        self.next += self.interval
        time.sleep(max(0.0, self.next - time.monotonic()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bus, name)


def _producer(config: Any, trajectories: int, rate: float, run_id: str, out: Any) -> None:
    """The stream's producer process: loadgen trajectories of `run_id`, each sent as it is made, at
    `rate` a second, with KafkaConfig `config`; puts the events it sent on `out`."""
    from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
    from trajlake.rollout.loadgen import LoadgenConfig, generate

    bus = KafkaPublisher(config)
    counts = generate(
        _Paced(bus, rate), LoadgenConfig(trajectories=trajectories, run_id=run_id, seed=2), chunk=1
    )
    bus.close()
    out.put(counts.events)


def _visible(lake: Any, trajectories: int, timeout_s: float, run_id: str) -> list[float]:
    """A SQL user polling `trajectories` of `run_id`: seconds from each one's last event (`finished_at`,
    set as the producer made it) to the first query that returned it."""
    seen: set[str] = set()
    lags: list[float] = []
    deadline = time.monotonic() + timeout_s
    while len(seen) < trajectories:
        if time.monotonic() > deadline:
            raise SystemExit(f"{trajectories - len(seen)} of {trajectories} streamed trajectories were not "
                             f"visible in SQL {timeout_s:g} s after the stream began")  # fmt: skip
        asked = time.time()
        rows = lake.sql("select trajectory_id, epoch_us(finished_at) as t from trajectories "
                        "where run_id = $run and finished_at is not null", {"run": run_id}).to_pylist()  # fmt: skip
        for row in rows:
            if row["trajectory_id"] not in seen:
                seen.add(row["trajectory_id"])
                lags.append(max(0.0, asked - row["t"] / 1e6))
        time.sleep(POLL_S)
    return lags


def stream(
    bootstrap: str, workdir: Path, trajectories: int, rate: float, sinks: int, bucket: str | None
) -> dict[str, Any]:
    """A stream at `rate` trajectories a second into `sinks` sinks and the projector: produce ->
    visible in SQL, and events per sink CPU-second (idle polls included, as a deployment spends)."""
    from trajlake.ingest.bus.kafka_admin import create_topic
    from trajlake.ingest.config import KafkaConfig
    from trajlake.store.lake import Lake

    topic = f"stream-{uuid.uuid4().hex[:8]}"
    create_topic(KafkaConfig(bootstrap=bootstrap, topic=topic, group_id=topic))
    root = f"s3://{bucket}/{topic}" if bucket else str(workdir / topic)
    lake = Lake(root)
    ctx = mp.get_context("spawn")
    out, ready, sent, stop, done = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    spool = workdir / topic / "spool"
    procs = [ctx.Process(target=_sink, args=(bootstrap, topic, root, spool, "projector", out, stop, ready))
             for _ in range(sinks)]  # fmt: skip
    procs.append(ctx.Process(target=_projector, args=(root, done, out)))
    config = KafkaConfig(
        bootstrap=bootstrap, topic=topic, group_id=topic, spool_dir=workdir / topic / "produce"
    )
    producer = ctx.Process(target=_producer, args=(config, trajectories, rate, "stream", sent))
    for proc in procs:
        proc.start()
    for _ in range(sinks):  # each holds partitions once the group has settled: no start-up in the figures
        ready.get(timeout=120)
    producer.start()
    try:
        lags = _visible(lake, trajectories, 120 + 5 * trajectories / rate, "stream")
    finally:
        stop.set()
        done.set()
        reports = [out.get(timeout=600) for _ in procs]
        for proc in [*procs, producer]:
            proc.join()
    sink_cpu = sum(r["cpu_s"] for r in reports if "events" in r)  # the projector's report counts none
    return _stream_figures("s3" if bucket else "local", sinks, rate, lags, sent.get(), sink_cpu)


def _stream_figures(
    lake: str, sinks: int, rate: float, lags: list[float], events: int, sink_cpu_s: float
) -> dict[str, Any]:
    lags = sorted(lags)
    return {"lake": lake, "sinks": sinks, "trajectories": len(lags), "rate": rate, "events": events,
            "events_per_sink_cpu_s": events / sink_cpu_s, "visible_p50_s": statistics.median(lags),
            "visible_p99_s": lags[math.ceil(0.99 * len(lags)) - 1], "visible_max_s": lags[-1]}  # fmt: skip


def on_stack(directory: Path, workdir: Path, trajectories: int, rate: float) -> dict[str, Any]:
    """The stream into a running `trajlake stack`: its producer principal sends to its topic, the
    stack's own sinks and projector store it, a SQL user with the reader's key polls; the sinks'
    CPU is read from /proc (they ingest whatever else the topic carries meanwhile too)."""
    from trajlake.common.procs import cpu_seconds
    from trajlake.common.settings import env_name
    from trajlake.deploy.config import READER, WRITER
    from trajlake.deploy.kafka_security import kafka_config
    from trajlake.deploy.stack import Stack, stack_env
    from trajlake.schemas.settings import LakeSettings
    from trajlake.store.lake import Lake

    stack = Stack.load(directory)
    sinks = [p.pid for p in stack.processes if p.name.startswith("sink-") and p.is_alive()] if stack else []
    if not sinks:
        raise SystemExit(
            f"no stack with running sinks in {directory}; start one with `trajlake stack up --dir {directory}`"
        )

    def sink_cpu() -> float:
        return sum(cpu_seconds(pid) or 0.0 for pid in sinks)

    reader = stack_env(directory, READER)
    os.environ.update({k: v for k, v in reader.items() if k.startswith("AWS_")})  # the SQL user's S3 key
    lake = Lake(reader[env_name(LakeSettings, "lake")])
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("spawn")
    sent = ctx.Queue()
    config = kafka_config(stack_env(directory, WRITER), spool_dir=workdir / "stack-produce")
    producer = ctx.Process(target=_producer, args=(config, trajectories, rate, run_id, sent))
    cpu0 = sink_cpu()
    producer.start()
    try:
        lags = _visible(lake, trajectories, 120 + 5 * trajectories / rate, run_id)
    finally:
        producer.join()
    return _stream_figures(
        f"stack ({len(sinks)} sinks)", len(sinks), rate, lags, sent.get(), sink_cpu() - cpu0
    )


def main(argv: list[str] | None = None) -> int:
    ratios = {f"{kind}_{sinks}_sinks": "higher" for kind in ("ratio", "s3") for sinks in SINKS}
    bench = Bench("scale_out", __doc__, ratios=ratios)
    parser = bench.parser
    parser.add_argument("--trajectories", type=int, help="backlog size (default 1500 quick, 6000 full)")
    parser.add_argument("--stream", type=int, help="trajectories streamed (default 200 quick, 1200 full)")
    parser.add_argument("--rate", type=float, default=20.0, help="trajectories a second the stream sends")
    parser.add_argument("--stack", type=Path, metavar="DIR", help="instead: the stream into the running "
                        "`trajlake stack` in DIR, beside the same stream into one sink and a local lake")  # fmt: skip
    args = bench.parse(argv)
    trajectories = args.trajectories or (1500 if args.quick else 6000)
    streamed = args.stream or (200 if args.quick else 1200)
    if args.stack is not None:
        if args.check or args.write_baseline:
            parser.error(
                "--stack measures one deployment and has no baseline: drop --check / --write-baseline"
            )
        return stack_main(bench, args, streamed)

    with bench.scratch() as tmp:
        workdir = Path(tmp)
        with kafka(workdir) as bootstrap, seaweedfs(workdir):
            runs = []
            for sinks in SINKS:
                for design, on_s3 in RUNS:
                    figures = drain(
                        bootstrap, workdir, trajectories, design, sinks, BUCKET if on_s3 else None
                    )
                    runs.append(figures)
                    print(json.dumps(figures))
            streams = []
            for sinks in SINKS:
                for on_s3 in (False, True):
                    figures = stream(
                        bootstrap, workdir, streamed, args.rate, sinks, BUCKET if on_s3 else None
                    )
                    streams.append(figures)
                    print(json.dumps(figures))
    result = {**summarize(runs, args.quick, trajectories), "streams": streams}
    return bench.finish(args, result, report(runs) + "\n" + report_streams(streams))


def stack_main(bench: Bench, args: Any, streamed: int) -> int:
    """`--stack DIR`: the stack's stream and the local one side by side; their ratios."""
    with bench.scratch() as tmp:
        workdir = Path(tmp)
        with kafka(workdir) as bootstrap:
            local = stream(bootstrap, workdir, streamed, args.rate, 1, None)
        stacked = on_stack(args.stack.resolve(), workdir, streamed, args.rate)
    result = {"quick": args.quick, "streams": [local, stacked],
              "stack_vs_local_events_per_sink_cpu_s": stacked["events_per_sink_cpu_s"] / local["events_per_sink_cpu_s"],
              "stack_vs_local_visible_p50": stacked["visible_p50_s"] / local["visible_p50_s"]}  # fmt: skip
    print(report_streams(result["streams"]))
    print(f"stack / local: events per sink CPU-s {result['stack_vs_local_events_per_sink_cpu_s']:.2f}, "
          f"produce -> visible p50 {result['stack_vs_local_visible_p50']:.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


@contextlib.contextmanager
def kafka(workdir: Path) -> Iterator[str]:
    """The broker at $TRAJLAKE_KAFKA_BOOTSTRAP, or one started in `workdir` for the run."""
    from trajlake.ingest.broker import BrokerConfig, free_port, start_broker, stop_broker

    bootstrap = os.environ.get("TRAJLAKE_KAFKA_BOOTSTRAP")
    if bootstrap:
        yield bootstrap
        return
    broker_dir = workdir / "broker"
    try:
        yield start_broker(BrokerConfig(port=free_port(), data_dir=broker_dir))
    finally:
        stop_broker(broker_dir)


@contextlib.contextmanager
def seaweedfs(workdir: Path) -> Iterator[None]:
    """A SeaweedFS server in `workdir` holding the bucket, its settings in this process's environment."""
    from trajlake.store.s3_server import S3ServerConfig, free_port, start_s3, stop_s3

    data_dir = workdir / "s3"
    try:
        os.environ.update(start_s3(S3ServerConfig(port=free_port(), data_dir=data_dir, bucket=BUCKET)).env())
        yield
    finally:
        stop_s3(data_dir)


def summarize(runs: list[dict[str, Any]], quick: bool, trajectories: int) -> dict[str, Any]:
    by = {(r["design"], r["lake"], r["sinks"]): r["events_per_sink_cpu_s"] for r in runs}
    result: dict[str, Any] = {"quick": quick, "trajectories": trajectories, "runs": runs}
    for sinks in SINKS:
        local = by[("projector", "local", sinks)]
        result[f"ratio_{sinks}_sinks"] = local / by[("before", "local", sinks)]
        result[f"s3_{sinks}_sinks"] = by[("projector", "s3", sinks)] / local
    return result


def report(runs: list[dict[str, Any]]) -> str:
    lines = [f"{'design':<10} {'lake':<5} {'sinks':>5} {'ev/sink-CPU-s':>14} {'ev/s':>8} {'projector CPU-s':>15} "
             f"{'races pos/commit':>16} {'fresh p50/p99 s':>16}"]  # fmt: skip
    for r in runs:
        projector = f"{r['projector_cpu_s']:.1f}" if r["projector_cpu_s"] is not None else "-"
        fresh = f"{r['freshness_p50_s'] or 0:.2f}/{r['freshness_p99_s'] or 0:.2f}"
        lines.append(f"{r['design']:<10} {r['lake']:<5} {r['sinks']:>5} {r['events_per_sink_cpu_s']:>14.0f} "
                     f"{r['events_per_s']:>8.0f} {projector:>15} {r['position_races']:>7}/{r['commit_races']:<8} "
                     f"{fresh:>16}")  # fmt: skip
    summary = summarize(runs, False, 0)
    for kind, what in (("ratio", "sinks + projector / before"), ("s3", "S3 lake / local lake")):
        lines.append(f"{what} (events per sink CPU-s): "
                     + ", ".join(f"{s} sinks {summary[f'{kind}_{s}_sinks']:.2f}" for s in SINKS))  # fmt: skip
    return "\n".join(lines)


def report_streams(streams: list[dict[str, Any]]) -> str:
    lines = [f"produce -> visible in SQL ({streams[0]['trajectories']} trajectories at {streams[0]['rate']:g}/s, "
             f"polled every {POLL_S:g} s):",
             f"{'lake':<16} {'sinks':>5} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'ev/sink-CPU-s':>14}"]  # fmt: skip
    for r in streams:
        lines.append(f"{r['lake']:<16} {r['sinks']:>5} {r['visible_p50_s']:>7.2f} {r['visible_p99_s']:>7.2f} "
                     f"{r['visible_max_s']:>7.2f} {r['events_per_sink_cpu_s']:>14.0f}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    run(main)
