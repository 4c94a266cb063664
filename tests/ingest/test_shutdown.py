"""SIGINT and SIGTERM stop a producer gracefully: what it holds is flushed or spooled, and it says so.

The producers run in processes of their own and get real signals; the lake (or the Kafka topic,
sunk into a lake) must then hold every trajectory they started, the one cut short marked as such.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.fixtures.kafka import sink_topic
from tests.helpers import wait_until
from trajlake.ingest import shutdown
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.shutdown import StopRequested
from trajlake.ingest.sink import DeltaSink, SinkThread
from trajlake.store.lake import Lake

PRODUCER = """
import faulthandler, signal, sys, time
from trajlake.ingest import shutdown
from trajlake.ingest.bus import setup_bus
from trajlake.ingest.recorder import Recorder

bus_kind, lake_root, bootstrap, topic, entry = sys.argv[1:6]
HELD = int(sys.argv[6])  # the trajectory left open until the signal
faulthandler.register(signal.SIGUSR1)  # a producer that does not stop shows where it hangs
print(f"started with SIGINT {signal.getsignal(signal.SIGINT)}, blocked {signal.pthread_sigmask(signal.SIG_BLOCK, [])}",
      file=sys.stderr, flush=True)


def main():
    if bus_kind == "inprocess":
        from trajlake.ingest.sink import DeltaSink, SinkThread
        from trajlake.store.lake import Lake

        bus = setup_bus("inprocess")
        SinkThread(DeltaSink(Lake(lake_root), bus))
    else:
        bus = setup_bus("kafka", bootstrap=bootstrap, topic=topic)
    recorder = Recorder(bus, "stopped", vocab_size=100, flush_each_turn=False)
    for i in range(100_000):
        traj = recorder.start(f"task-{i % 7}", trajectory_id=f"t{i:06d}")
        print(traj.trajectory_id, flush=True)
        traj.turn([1, 2, 3], [-0.1, -0.2, -0.3], i // 50, input_token_ids=[4, 5])
        # the signal comes while this one is open; in slices, since the kernel may hand it to another
        # thread (Kafka's), and Python runs its handler on the main thread between two sleeps, not in one
        for _ in range(60_000 if i == HELD else 1):
            time.sleep(0.005)
        traj.reward(1.0)
        traj.finish("completed")


if entry == "run":
    sys.exit(shutdown.run(main, "producer"))
main()  # a program that uses the Recorder alone: settled at exit
"""


def start_producer(
    tmp_path: Path,
    bus: str,
    entry: str,
    topic: str = "-",
    bootstrap: str = "-",
    blocked: bool = False,
    **env: str,
) -> subprocess.Popen:
    script = tmp_path / "producer.py"
    script.write_text(textwrap.dedent(PRODUCER))
    args = [sys.executable, str(script), bus, str(tmp_path / "lake"), bootstrap, topic, entry, str(HELD)]
    env = {**os.environ, "TRAJLAKE_KAFKA_SPOOL_DIR": str(tmp_path / "spool"), **env}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, shutdown.SIGNALS)) if blocked else None,
    )  # fmt: skip


HELD = 40


def stop_after(proc: subprocess.Popen, sig: signal.Signals) -> tuple[list[str], str]:
    """Wait until `proc` started the trajectory it holds open, send `sig`; its trajectory ids and stderr."""
    assert proc.stdout is not None
    ids = [proc.stdout.readline().strip() for _ in range(HELD + 1)]
    assert all(ids), f"the producer stopped early: {proc.communicate()[1]}"
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # faulthandler dumps every thread's stack on stderr
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        proc.kill()
        pytest.fail(
            f"the producer did not stop within 120 s of {sig.name}; its threads:\n{proc.communicate()[1]}"
        )
    return ids + out.split(), err


def assert_every_started_trajectory_is_stored(lake: Lake, ids: list[str], sig: signal.Signals) -> None:
    rows = lake.sql(
        "select trajectory_id, status, failure_origin, failure_label, message from trajectories "
        "where run_id = 'stopped' order by trajectory_id"
    ).to_pylist()
    assert [r["trajectory_id"] for r in rows] == sorted(ids)
    cut = [r for r in rows if r["status"] != "completed"]
    assert [r["trajectory_id"] for r in cut] == [ids[-1]]  # only the one open at the signal
    assert (cut[0]["status"], cut[0]["failure_origin"], cut[0]["failure_label"]) == (
        "error",
        "system",
        "infra",
    )
    assert sig.name in cut[0]["message"]


@pytest.mark.integration  # producers in processes of their own, stopped with real signals
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_producer_leaves_every_trajectory_it_started_in_the_lake(tmp_path, sig) -> None:
    proc = start_producer(tmp_path, "inprocess", "run")
    ids, err = stop_after(proc, sig)
    assert proc.returncode == 128 + sig
    assert f"producer: stopped by {sig.name}" in err
    assert "recorded the 1 open trajectories as ended by the stop" in err
    assert "committed the last" in err and "LOST" not in err
    lake = Lake(tmp_path / "lake")
    assert_every_started_trajectory_is_stored(lake, ids, sig)


@pytest.mark.integration
def test_a_producer_started_with_the_stop_signals_blocked_still_stops(tmp_path) -> None:
    # a parent's preexec may hand its children SIGINT blocked (Ray's does): the stop must still come through
    proc = start_producer(tmp_path, "inprocess", "run", blocked=True)
    ids, err = stop_after(proc, signal.SIGINT)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert_every_started_trajectory_is_stored(Lake(tmp_path / "lake"), ids, signal.SIGINT)


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_kafka_producer_delivers_every_trajectory_it_started(
    tmp_path, kafka_topic, lake, sig
) -> None:
    proc = start_producer(tmp_path, "kafka", "run", kafka_topic.topic, kafka_topic.bootstrap)
    ids, err = stop_after(proc, sig)
    assert proc.returncode == 128 + sig
    assert f"Kafka topic {kafka_topic.topic} at {kafka_topic.bootstrap}: delivered" in err, err
    assert "spooled" not in err  # the broker was there: nothing left for a later run
    sink_topic(lake, kafka_topic)
    assert_every_started_trajectory_is_stored(lake, ids, sig)


@pytest.mark.integration
def test_a_program_that_only_uses_the_recorder_is_settled_at_exit(tmp_path) -> None:
    proc = start_producer(tmp_path, "inprocess", "bare")
    ids, err = stop_after(proc, signal.SIGTERM)
    assert proc.returncode != 0  # the stop was not the program's to handle: it ends as interrupted
    assert "trajlake: stopped by SIGTERM" in err and "recorded the 1 open trajectories" in err
    assert_every_started_trajectory_is_stored(Lake(tmp_path / "lake"), ids, signal.SIGTERM)


@pytest.mark.integration
def test_a_stop_with_kafka_unreachable_spools_and_the_next_producer_sends_it(
    tmp_path, kafka_topic, lake
) -> None:
    from trajlake.ingest.broker import free_port
    from trajlake.ingest.bus.kafka import KafkaBus

    quick = {"TRAJLAKE_KAFKA_MAX_BLOCK_S": "0.2", "TRAJLAKE_STOP_TIMEOUT_S": "1"}
    nowhere = f"127.0.0.1:{free_port()}"
    proc = start_producer(tmp_path, "kafka", "run", kafka_topic.topic, nowhere, **quick)
    ids, err = stop_after(proc, signal.SIGTERM)
    assert proc.returncode == 143
    spool = tmp_path / "spool" / kafka_topic.topic
    assert f"to {spool}: the next producer of topic {kafka_topic.topic} sends them" in err, err
    later = KafkaBus(kafka_topic)  # the next run, with the broker there: it takes the spool over
    later.flush(timeout_s=60)
    later.close()
    assert not list(spool.glob("spool-*.bin"))
    sink_topic(lake, kafka_topic)
    assert_every_started_trajectory_is_stored(lake, ids, signal.SIGTERM)


# -- in this process: the mechanism itself ------------------------------------------------------
@pytest.fixture
def registry(monkeypatch):
    """A fresh stop state and holder registry (other tests' live objects are not settled), with the
    stop handlers installed over whatever handlers earlier tests or libraries left in this process
    (`install` keeps a program's own: the signals below would then end the test run)."""
    monkeypatch.setattr(shutdown, "_state", shutdown._State())
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in shutdown.SIGNALS}
    try:
        with shutdown.signals():
            assert all(signal.getsignal(sig) is shutdown._on_signal for sig in shutdown.SIGNALS)
            yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_signal_in_a_deferred_block_is_raised_when_the_block_ends(registry) -> None:
    finished = []
    with pytest.raises(StopRequested) as stop, shutdown.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: shutdown.requested() is not None, 10, "the handler")
        finished.append(True)  # not cut: the block runs to its end
    assert finished == [True]
    assert (stop.value.name, stop.value.exit_code) == ("SIGTERM", 143)


def test_settling_publishes_open_trajectories_before_the_sink_commits(registry, lake) -> None:
    bus = InProcessBus()
    sink = SinkThread(DeltaSink(lake, bus))
    traj = Recorder(bus, "held", flush_each_turn=False).start("task", trajectory_id="open-one")
    traj.turn([1], [-0.5], None, input_token_ids=[2])
    with pytest.raises(StopRequested):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)  # the handler raises long before
    lines = shutdown.settle()
    assert lines[0].startswith("run held: recorded the 1 open trajectories")
    assert lines[1].startswith("committed the last 3 events to the lake")
    assert len(lines) == 2  # nothing left on the bus: no LOST line
    row = lake.sql("select status, failure_label, message from trajectories").to_pylist()
    assert row == [{"status": "error", "failure_label": "infra",
                    "message": "the producer stopped on SIGINT before the trajectory ended"}]  # fmt: skip
    assert not sink.job.done() or sink.job.exception() is None


def test_a_program_s_own_signal_handler_is_kept(monkeypatch) -> None:
    monkeypatch.setattr(shutdown, "_state", shutdown._State())
    mine = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        Recorder(InProcessBus(), "r")  # installs the stop handlers where the defaults are
        assert signal.getsignal(signal.SIGTERM) is not shutdown._on_signal
    finally:
        signal.signal(signal.SIGTERM, mine)
