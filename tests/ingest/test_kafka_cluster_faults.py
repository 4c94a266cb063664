"""Faults on a real 3-node cluster (RF 3, min.insync.replicas 2) while a producer streams throughout:
a partition leader and the active controller SIGKILLed, one of two sinks SIGKILLed, the projector
SIGKILLed mid-catch-up, and two of three nodes down for a while. At the end every produced event
is stored once and only bad input is a dead letter. Each test prints its row of the fault table
(produced, stored, distinct, dead letters, and the stall: the longest time without an events commit)."""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.kafka import SMALL_TURNS, KafkaCluster, wait_for_log
from tests.helpers import wait_until
from trajlake.ingest.config import KafkaConfig
from trajlake.store.lake import Lake

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SINK_ENV = {"TRAJLAKE_KAFKA_SESSION_TIMEOUT_S": "6"}  # the group drops a killed sink within seconds


class Stream:
    """`trajlake loadgen` runs back to back on a thread, each its own run id: a producer streaming
    until `stop`; each run's exit code and JSON report are kept."""

    def __init__(self, trajlake_cli, config: KafkaConfig, env: dict[str, str] | None = None) -> None:
        self.args = ("loadgen", "--kafka", config.bootstrap, "--topic", config.topic, "--json", *SMALL_TURNS)
        self.spawn, self.env = trajlake_cli, env
        self.runs: list[tuple[int, dict, str]] = []
        self.procs: list = []  # every run's process, the one in progress last
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        i = 0
        while not self._stop.is_set():
            proc = self.spawn(
                *self.args, "--trajectories", "120", "--run", f"s{i}", "--seed", str(i), env=self.env
            )
            self.procs.append(proc)
            out, _ = proc.communicate(timeout=600)
            report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            self.runs.append((proc.returncode, report, proc.log_path.read_text(errors="replace")))
            i += 1

    def stop(self) -> int:
        """Let the run in progress finish; return the events every run generated."""
        self._stop.set()
        self._thread.join(timeout=600)
        for code, report, log in self.runs:
            assert "Traceback" not in log, log[-3000:]
            assert code == 0 or (code == 1 and report.get("undelivered_messages", 0) > 0), (
                code,
                report,
                log[-2000:],
            )
        return sum(report["events"] for _, report, _ in self.runs)


def sink(trajlake_cli, config: KafkaConfig, lake: Path, *extra: str):
    return trajlake_cli(
        "ingest", "--kafka", config.bootstrap, "--topic", config.topic, "--group", config.group_id,
        "--lake", str(lake), "--max-latency", "0.3", "--no-update-projections", *extra, env=SINK_ENV,
    )  # fmt: skip


def commits(lake: Path) -> int:
    return Lake(lake).version("events")


def wait_for_commits(lake: Path, more: int, timeout_s: float = 180, watched: tuple = ()) -> None:
    """Wait for `more` events commits; a timeout shows the tail of each `watched` process's log."""
    start = commits(lake)
    try:
        wait_until(lambda: commits(lake) >= start + more, timeout_s, f"{more} more events commits")
    except AssertionError as err:
        tails = "".join(
            f"\n--- {p.log_path}:\n{p.log_path.read_text(errors='replace')[-2500:]}" for p in watched
        )
        raise AssertionError(f"{err}{tails}") from None


def stall_after(lake: Path, fault_at: float) -> float:
    """The longest time without an events commit, from the last commit before the fault on."""
    times = sorted(Lake(lake).log.commit_times("events", -1, commits(lake)).values())
    window = [t for t in times if t >= fault_at] or [time.time()]
    before = [t for t in times if t < fault_at]
    points = [*before[-1:], *window]
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


def finish(
    trajlake_cli, config: KafkaConfig, lake: Path, stream: Stream, sinks: list, spool: Path
) -> tuple[int, int]:
    """Stop the stream and the sinks, deliver what producers spooled, drain; return the events
    produced and the replays the sinks that reported skipped (a killed sink reports nothing)."""
    from trajlake.ingest.bus.kafka_publisher import KafkaPublisher

    produced = stream.stop()
    leftover = KafkaPublisher(config.model_copy(update={"spool_dir": spool}))
    leftover.flush(timeout_s=120)  # what a producer spooled goes out with the next producer of the topic
    leftover.close()
    assert leftover.spool_stats().messages == 0
    reports = []
    for running in sinks:
        if running.poll() is None:
            running.send_signal(signal.SIGTERM)
            reports.append(running.communicate(timeout=120)[0])
    final = sink(trajlake_cli, config, lake, "--until-idle", "3")
    reports.append(final.communicate(timeout=600)[0])
    assert final.returncode == 0, final.log_path.read_text(errors="replace")[-3000:]
    replayed = sum(
        json.loads(out.strip().splitlines()[-1]).get("replayed", 0) for out in reports if out.strip()
    )
    return produced, replayed


def report(
    name: str,
    lake: Path,
    finished: tuple[int, int],
    stall: float,
    capsys,
    **more: float,
) -> dict:
    """Count what the lake holds, print the fault's row, and check nothing was lost or doubled."""
    produced, replayed = finished
    store = Lake(lake)
    counts = store.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
    dead = store.read("dead_letters").num_rows if store.exists("dead_letters") else 0
    row = {"fault": name, "produced": produced, "stored": counts["n"], "distinct": counts["d"],
           "dead_letters": dead, "replayed": replayed, "stall_s": round(stall, 1), **more}  # fmt: skip
    with capsys.disabled():
        print(f"\nFAULT {json.dumps(row)}")
    assert (counts["d"], dead) == (produced, 0), row  # nothing lost, nothing dead-lettered
    assert counts["n"] == counts["d"], row  # nothing stored twice
    return row


def started(
    kafka_cluster: KafkaCluster, trajlake_cli, tmp_path: Path, sinks: int = 1, env: dict | None = None
):
    config = kafka_cluster.topic(tmp_path)
    lake = tmp_path / "lake"
    running = [sink(trajlake_cli, config, lake) for _ in range(sinks)]
    for s in running:
        wait_for_log(s, "partitions assigned", timeout_s=180)
    stream = Stream(trajlake_cli, config, env)
    wait_for_commits(lake, 3)
    return config, lake, running, stream


@pytest.mark.parametrize("victim", ["partition leader", "active controller"])
def test_a_killed_node_stalls_writes_for_seconds_and_loses_nothing(
    kafka_cluster: KafkaCluster, trajlake_cli, tmp_path: Path, capsys, victim: str
) -> None:
    from trajlake.ingest.bus.kafka_admin import KafkaAdmin

    config, lake, sinks, stream = started(kafka_cluster, trajlake_cli, tmp_path)
    node = (
        kafka_cluster.leader(config, 0)
        if victim == "partition leader"
        else kafka_cluster.active_controller(config)
    )
    fault_at = time.time()
    kafka_cluster.kill(node)
    try:
        health: list[str] = []

        def told_down() -> bool:
            with KafkaAdmin(config, timeout_s=5) as admin:
                health.append(admin.health().describe())
            return f"broker(s) {node} of 3 down" in health[-1]

        wait_until(told_down, 120, "the admin to name the node down")  # not "the cluster is unreachable"
        wait_for_commits(lake, 3)  # writes go on: the other two lead and keep min.insync.replicas
    finally:
        kafka_cluster.restart()
        kafka_cluster.wait_in_sync(config)
    wait_for_commits(lake, 2)
    stall = stall_after(lake, fault_at)
    finished = finish(trajlake_cli, config, lake, stream, sinks, tmp_path / "spool")
    report(f"{victim} SIGKILL + restart", lake, finished, stall, capsys)


def test_a_killed_sinks_partitions_go_to_the_other_sink(
    kafka_cluster: KafkaCluster, trajlake_cli, tmp_path: Path, capsys
) -> None:
    config, lake, sinks, stream = started(kafka_cluster, trajlake_cli, tmp_path, sinks=2)
    fault_at = time.time()
    sinks[0].send_signal(signal.SIGKILL)
    sinks[0].wait()
    wait_for_log(sinks[1], "partitions assigned: [0, 1, 2, 3]", timeout_s=120)  # the survivor takes all four
    taken_over_s = time.time() - fault_at  # the killed sink's partitions waited this long
    wait_for_commits(lake, 3)
    stall = max(stall_after(lake, fault_at), taken_over_s)
    finished = finish(trajlake_cli, config, lake, stream, sinks[1:], tmp_path / "spool")
    report("one of two sinks SIGKILL", lake, finished, stall, capsys)


def test_a_projector_killed_mid_catch_up_is_resumed_by_its_successor(
    kafka_cluster: KafkaCluster, trajlake_cli, tmp_path: Path, capsys
) -> None:
    from trajlake.store import projections

    config, lake, sinks, stream = started(kafka_cluster, trajlake_cli, tmp_path)
    projector = trajlake_cli("project", "--lake", str(lake), "--follow", "--poll-interval", "0.2")
    wait_for_log(projector, "holds the projections")
    store = Lake(lake)
    wait_until(lambda: store.txn_version("trajectories", projections.APP_ID) is not None, 120, "a projection")
    fault_at = time.time()
    projector.send_signal(signal.SIGKILL)  # it catches up after every events commit: mid-catch-up
    projector.wait()
    successor = trajlake_cli("project", "--lake", str(lake), "--follow", "--poll-interval", "0.2")
    wait_for_log(successor, "holds the projections")
    finished = finish(trajlake_cli, config, lake, stream, sinks, tmp_path / "spool")
    successor.send_signal(signal.SIGTERM)
    out, _ = successor.communicate(timeout=300)
    assert successor.returncode == 0, successor.log_path.read_text(errors="replace")[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["position"] == Lake(lake).version("events")
    store = Lake(lake)
    keys = "run_id, trajectory_id"
    projected = store.sql(f"select * from trajectories order by {keys}").to_pylist()
    projections.rebuild(store)
    assert Lake(lake).sql(f"select * from trajectories order by {keys}").to_pylist() == projected
    stall = stall_after(lake, fault_at)
    report("projector SIGKILL mid-catch-up", lake, finished, stall, capsys)


def test_two_of_three_nodes_down_producers_spool_and_report_and_nothing_is_lost(
    kafka_cluster: KafkaCluster, trajlake_cli, tmp_path: Path, capsys
) -> None:
    # runs give up on the brokers soon, and spool: the one running at the fault too
    config, lake, sinks, stream = started(
        kafka_cluster, trajlake_cli, tmp_path, env={"TRAJLAKE_KAFKA_DELIVERY_TIMEOUT_S": "8"}
    )
    leader = kafka_cluster.leader(config, 0)
    down = [leader, next(n for n in (1, 2, 3) if n != leader)]  # one node left: below min.insync.replicas
    fault_at = time.time()
    for node in down:
        kafka_cluster.kill(node)
    try:
        wait_until(
            lambda: any(code == 1 for code, _, _ in stream.runs[-3:]), 600, "a run to spool and report"
        )
    finally:
        down_s = time.time() - fault_at
        kafka_cluster.restart()
        kafka_cluster.wait_in_sync(config)
    wait_for_commits(lake, 3, watched=(*sinks, *stream.procs[-2:]))
    stall = stall_after(lake, fault_at)
    finished = finish(trajlake_cli, config, lake, stream, sinks, tmp_path / "spool")
    spooled = [run for code, run, _ in stream.runs if code == 1]
    assert spooled and all(r["undelivered_messages"] > 0 for r in spooled)
    said = "".join(
        log for code, _, log in stream.runs if code == 1
    )  # what the brokers said: not "unreachable"
    assert f"broker(s) {', '.join(map(str, sorted(down)))} of 3 down" in said, said[-3000:]
    report("two of three nodes down", lake, finished, stall, capsys, down_s=round(down_s, 1))
