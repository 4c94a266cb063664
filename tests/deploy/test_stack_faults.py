"""Faults across `trajlake stack`: a part fails while a producer streams (and, where the fault is
the trainer's, two ranks sample); the lake then holds every trajectory the producer sent exactly
once, and each test prints how long the stall lasted.

One stack serves every test (starting one takes about a minute here); each test streams a run of
its own and leaves the stack whole again. Clients take their settings from the stack's env files
(`stack_env`) alone, as a user's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import trajlake, wait_until
from trajlake.deploy.config import READER, WRITER
from trajlake.deploy.processes import Process
from trajlake.deploy.stack import Stack, stack_env

pytestmark = pytest.mark.integration

EVENTS_PER_TRAJECTORY = 4
"""What the producer sends per trajectory: started, one turn, a reward, finished."""
PRODUCER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from trajlake.ingest.bus import setup_publisher
    from trajlake.ingest.recorder import Recorder
    run, stop, pace_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    bus = setup_publisher("kafka", bootstrap=os.environ["TRAJLAKE_KAFKA"])
    recorder = Recorder(bus, run, vocab_size=100, handle_signals=False)
    i = 0
    while not stop.exists():
        with recorder.start(task_id=f"task-{i // 2}", sample_index=i % 2, trajectory_id=f"{run}-{i}") as traj:
            traj.turn([4, 5], [-0.1, -0.2], 0, full_input_token_ids=[1, 2, 3])
            traj.reward(float(i % 2))
            traj.finish("completed")
        bus.flush()  # delivered to Kafka before it counts as sent
        print(f"{run}-{i}", flush=True)
        i += 1
        time.sleep(pace_s)  # the producer's rate
    bus.close()
    """
)
RANK = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from trajlake.store.catalog import Catalog
    from trajlake.store.lake import Lake
    from trajlake.trainer.config import SamplerConfig
    from trajlake.trainer.sampler import Sampler
    run, rank, flags = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    config = SamplerConfig(run_id=run, group_size=2, groups_per_batch=1, group_wait_s=0, max_staleness=1000,
                           lease_ttl_s=300, poll_interval_s=0.2)
    catalog = Catalog(os.environ["TRAJLAKE_CATALOG_URL"])
    sampler = Sampler(Lake(os.environ["TRAJLAKE_LAKE"]), catalog, config, rank=rank)
    def say(**fields):
        print(json.dumps({"rank": rank, "t": time.monotonic(), **fields}), flush=True)
    step = 0
    while not (flags / "stop").exists():
        batch = sampler.next_batch(0, step, timeout_s=0.5)
        if batch is None:
            continue
        say(leased=batch.trajectory_ids, step=step)
        if (flags / "hold").exists():
            say(holding=step)
            while (flags / "hold").exists():
                time.sleep(0.05)  # "training" on the batch until the test lets go
        say(committed=sampler.commit(batch), step=step)
        step += 1
    """
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running stack (1 broker, 2 sinks) in a directory the `postgres` user can reach; its logs
    are kept in pytest's temporary directory when it is removed."""
    base = Path(tempfile.mkdtemp(prefix="trajlake-faults-"))
    base.chmod(0o755)
    directory = base / "stack"
    try:
        _up(directory)
        yield directory
    finally:
        trajlake("stack", "down", "--dir", str(directory), check=False)
        logs = tmp_path_factory.mktemp("stack-logs")
        for log in directory.rglob("*.log"):
            shutil.copy(log, logs / f"{log.parent.name}-{log.name}")
        shutil.rmtree(base, ignore_errors=True)


def _up(directory: Path) -> float:
    """`trajlake stack up` (starts what is not running); return when it returned (monotonic)."""
    trajlake("stack", "up", "--dir", str(directory), "--brokers", "1", "--sinks", "2")
    return time.monotonic()


def _env(directory: Path, role: str) -> dict[str, str]:
    return {**os.environ, **stack_env(directory, role)}


class Producer:
    """A producer process streaming trajectories `<run>-<i>` into the stack's Kafka until stopped;
    `sent` lists each once Kafka acknowledged all its events."""

    def __init__(self, env: dict[str, str], run: str, workdir: Path, pace_s: float = 0.05) -> None:
        self.stop_file = workdir / f"{run}.stop"
        self.log = workdir / f"{run}-producer.log"
        with self.log.open("w") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-c", PRODUCER, run, str(self.stop_file), str(pace_s)],
                env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=err, text=True,
            )  # fmt: skip
        self.sent: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.sent.append(line.strip())

    def count(self) -> int:
        if self.proc.poll() not in (None, 0):
            raise AssertionError(f"the producer died: {self.log.read_text()[-3000:]}")
        return len(self.sent)

    def stop(self) -> list[str]:
        """Stop after the trajectory in hand; return every id it sent."""
        self.stop_file.touch()
        self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        assert self.proc.returncode == 0, self.log.read_text()[-3000:]
        return list(self.sent)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def producers() -> Iterator[list[Producer]]:
    started: list[Producer] = []
    yield started
    for producer in started:
        producer.kill()


def _streaming(
    directory: Path, run: str, workdir: Path, producers: list[Producer], stored: int
) -> tuple[Producer, dict[str, str], dict[str, str]]:
    """A producer streaming `run` with the writer's settings, once the lake holds `stored` of its
    trajectories; it, and the writer's and the reader's environments."""
    writer, reader = _env(directory, WRITER), _env(directory, READER)
    producers.append(producer := Producer(writer, run, workdir))
    _await_stored(reader, run, stored)
    return producer, writer, reader


def _sql(env: dict[str, str], query: str) -> list[dict]:
    out = trajlake("sql", "--format", "json", query, env=env, check=False)
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []


def _stored(reader: dict[str, str], run: str) -> dict[str, int]:
    """trajectory id -> its events in the lake, for `run` (the CLI takes no SQL parameters: the
    rows of every run, picked here)."""
    rows = _sql(reader, "select run_id, trajectory_id, count(*) as n from events "
                        "where trajectory_id is not null group by all")  # fmt: skip
    return {row["trajectory_id"]: int(row["n"]) for row in rows if row["run_id"] == run}


def _await_stored(reader: dict[str, str], run: str, n: int) -> None:
    wait_until(lambda: len(_stored(reader, run)) >= n, 180, f"{n} trajectories of {run} in the lake")


def _assert_whole(stack: Path, reader: dict[str, str], run: str, sent: list[str]) -> float:
    """Wait until the lake holds every sent trajectory whole and the projection lists each; assert
    nothing was lost or duplicated; return when it held them (monotonic)."""
    assert len(sent) == len(set(sent))
    whole = dict.fromkeys(sent, EVENTS_PER_TRAJECTORY)

    def holds_all() -> bool:
        stored = _stored(reader, run)
        return all(stored.get(tid, 0) >= n for tid, n in whole.items())

    try:
        wait_until(holds_all, 300, f"the {len(sent)} trajectories of {run} in the lake")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{_sinks_stacks(stack)}") from None
    held_at = time.monotonic()
    stored = _stored(reader, run)
    lost = sorted(set(sent) - set(stored))
    duplicated = {tid: n for tid, n in stored.items() if n != EVENTS_PER_TRAJECTORY}
    assert (lost, duplicated, sorted(set(stored) - set(sent))) == ([], {}, [])
    projected: list[str] = []

    def all_projected() -> bool:
        rows = _sql(reader, "select run_id, trajectory_id from trajectories")
        projected[:] = [r["trajectory_id"] for r in rows if r["run_id"] == run]
        return len(projected) >= len(sent)

    wait_until(all_projected, 300, f"the projection of the {len(sent)} trajectories of {run}")
    assert sorted(projected) == sorted(sent)  # each once
    return held_at


def _rank_log(tmp_path: Path, rank: int) -> str:
    return (tmp_path / f"rank-{rank}.log").read_text()[-3000:]


def _process(directory: Path, name: str) -> Process:
    stack = Stack.load(directory)
    assert stack is not None
    return next(p for p in stack.processes if p.name == name)


def _sinks_stacks(stack: Path) -> str:
    """Where each live sink waits (`kill -USR1` dumps its threads' stacks to its log), with its log's tail."""
    sinks = [p for p in Stack.load(stack).processes if p.name.startswith("sink-") and p.is_alive()]
    sizes = {p.name: Path(p.log).stat().st_size for p in sinks}
    for p in sinks:
        os.kill(p.pid, signal.SIGUSR1)
    with contextlib.suppress(AssertionError):  # the tails below say what there is
        wait_until(lambda: all("most recent call first" in _log_since(p.log, sizes[p.name]) for p in sinks), 10,
                   "the sinks' stacks in their logs")  # fmt: skip
    return "\n".join(f"--- {p.name} ---\n{_log_since(p.log, max(0, sizes[p.name] - 4000))}" for p in sinks)


def _log_since(path: str, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _report(fault: str, **figures: object) -> None:
    print(f"\nFAULT {fault}: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in figures.items()))  # fmt: skip


def test_a_catalog_restart_while_two_ranks_hold_leases_hands_nothing_out_twice(
    stack: Path, producers: list[Producer], tmp_path: Path
) -> None:
    from trajlake.store.catalog import Catalog
    from trajlake.store.postgres_server import stop_postgres

    run = "fault-pg"
    producer, writer, reader = _streaming(stack, run, tmp_path, producers, 10)
    flags = tmp_path / "flags"
    flags.mkdir()
    errors = [(tmp_path / f"rank-{r}.log").open("w") for r in (0, 1)]
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, run, str(r), str(flags)], env=writer, text=True,
                              stdout=subprocess.PIPE, stderr=errors[r]) for r in (0, 1)]  # fmt: skip
    said: list[dict] = []
    readers = [threading.Thread(target=lambda p=p: said.extend(json.loads(line) for line in p.stdout),
                                daemon=True) for p in ranks]  # fmt: skip
    for thread in readers:
        thread.start()

    def ranks_say(key: str, after: float = 0.0, steps: int = 1) -> bool:
        if dead := [r for r, p in enumerate(ranks) if p.poll() is not None]:
            raise AssertionError(f"rank {dead[0]} exited: {_rank_log(tmp_path, dead[0])}")
        return all(
            sum(1 for s in said if key in s and s["rank"] == r and s["t"] > after) >= steps for r in (0, 1)
        )

    try:
        wait_until(lambda: ranks_say("committed"), 240, "both ranks committing batches")
        (flags / "hold").touch()
        wait_until(lambda: ranks_say("holding"), 120, "both ranks holding a leased batch")
        held = {s["rank"]: s["holding"] for s in said if "holding" in s}
        stopped_at = time.monotonic()
        stop_postgres(stack / "postgres", mode="fast")
        restarted_at = _up(stack)  # starts PostgreSQL again, on the port the ranks' URLs name
        assert stack_env(stack, WRITER)["TRAJLAKE_CATALOG_URL"] == writer["TRAJLAKE_CATALOG_URL"]
        (flags / "hold").unlink()
        wait_until(lambda: ranks_say("committed", after=restarted_at, steps=2), 240,
                   "both ranks committing again after the restart")  # fmt: skip
        resumed_at = time.monotonic()
    finally:
        (flags / "stop").touch()
        for proc, log in zip(ranks, errors, strict=True):
            proc.wait(timeout=120)
            log.close()
        for thread in readers:
            thread.join(timeout=10)
    assert [p.returncode for p in ranks] == [0, 0], _rank_log(tmp_path, 0) + _rank_log(tmp_path, 1)

    leased = [tid for s in said if "leased" in s for tid in s["leased"]]
    committed = [tid for s in said if "committed" in s for tid in s["committed"]]
    assert len(leased) == len(set(leased)), "a trajectory was handed out twice"
    for rank, step in held.items():  # the batches held across the restart were committed whole
        lease = next(
            s["leased"] for s in said if s["rank"] == rank and s.get("step") == step and "leased" in s
        )
        done = next(
            s["committed"] for s in said if s["rank"] == rank and s.get("step") == step and "committed" in s
        )
        assert sorted(done) == sorted(lease)
    assert sorted(committed) == sorted(leased)
    catalog = Catalog(reader["TRAJLAKE_CATALOG_URL"])
    try:
        assert sorted(catalog.consumed_ids(run)) == sorted(committed)
        assert catalog.lease_counts(run)["live"] == 0
    finally:
        catalog.close()
    sent = producer.stop()
    _assert_whole(stack, reader, run, sent)
    _report("catalog restarted while two ranks held leases", catalog_down_s=restarted_at - stopped_at,
            resumed_after_restart_s=resumed_at - restarted_at, handed_out=len(leased),
            consumed=len(committed), sent=len(sent))  # fmt: skip


def test_the_projector_killed_during_a_compaction_catches_up_after_a_restart(
    stack: Path, producers: list[Producer], tmp_path: Path
) -> None:
    run = "fault-projector"
    producer, writer, reader = _streaming(stack, run, tmp_path, producers, 20)
    compaction = subprocess.Popen(
        [sys.executable, "-c", "from trajlake.cli import run; run()", "compact"],
        env=writer, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert compaction.stderr is not None
    first = compaction.stderr.readline()  # its first progress line: a table compacted, others to go
    projector = _process(stack, "projector")
    killed_at = time.monotonic()
    os.killpg(projector.pid, signal.SIGKILL)
    during = compaction.poll() is None
    wait_until(lambda: not projector.is_alive(), 30, "the projector to die")
    out, err = compaction.communicate(timeout=300)
    assert compaction.returncode == 0, err[-3000:]
    assert during, f"the compaction ended before the projector was killed: {first}{err}"
    restarted_at = _up(stack)
    sent = producer.stop()
    held_at = _assert_whole(stack, reader, run, sent)
    _report("projector killed during a compaction", projector_down_s=restarted_at - killed_at,
            caught_up_after_restart_s=held_at - restarted_at, sent=len(sent),
            compaction=out.strip().replace("\n", "; ")[:300])  # fmt: skip


def test_a_sink_whose_s3_key_is_revoked_fails_loudly_and_resumes_once_it_is_restored(
    stack: Path, producers: list[Producer], tmp_path: Path
) -> None:
    from trajlake.store.s3_server import S3Layout, running_pid

    run = "fault-key"
    s3_dir = stack / "s3"
    layout = S3Layout.load(s3_dir)
    weed = running_pid(s3_dir)
    assert layout is not None and weed is not None
    producer, writer, reader = _streaming(stack, run, tmp_path, producers, 5)
    sinks = [_process(stack, f"sink-{i}") for i in (1, 2)]
    offsets = {p.name: Path(p.log).stat().st_size for p in sinks}
    key = writer["AWS_ACCESS_KEY_ID"]
    # SeaweedFS reads its identity file again on SIGHUP: the writer's key is gone from it
    revoked = [i for i in layout.identities() if i["name"] != key]
    (s3_dir / "s3.json").write_text(json.dumps({"identities": revoked}))
    revoked_at = time.monotonic()
    os.kill(weed, signal.SIGHUP)
    refused = f"AWS_ACCESS_KEY_ID={key}"  # the sink's error names the key the store refused

    def said(p: Process) -> list[str]:
        return [x for x in _log_since(p.log, offsets[p.name]).splitlines() if "cannot use the lake" in x]

    wait_until(
        lambda: any(refused in x for p in sinks for x in said(p)), 120, "a sink to name the refused key"
    )
    noticed_at = time.monotonic()
    wait_until(lambda: not any(p.is_alive() for p in sinks), 120, "every sink to stop on the refused key")
    stopped_at = time.monotonic()
    layout.save(s3_dir)  # the key restored
    os.kill(weed, signal.SIGHUP)
    restarted_at = _up(stack)
    sent = producer.stop()
    held_at = _assert_whole(stack, reader, run, sent)
    line = next(x for p in sinks for x in said(p) if refused in x)
    _report("writer's S3 key revoked", error_after_s=noticed_at - revoked_at,
            sinks_stopped_after_s=stopped_at - revoked_at, restored_and_up_after_s=restarted_at - revoked_at,
            caught_up_after_restore_s=held_at - restarted_at, sent=len(sent), said=line.strip()[:400])  # fmt: skip


def test_sinks_lose_and_duplicate_nothing_when_seaweedfs_is_killed_during_their_commits(
    stack: Path, producers: list[Producer], tmp_path: Path
) -> None:
    from trajlake.store.s3_server import running_pid

    run = "fault-s3"
    producer, _, reader = _streaming(stack, run, tmp_path, producers, 5)
    sinks = [_process(stack, f"sink-{i}") for i in (1, 2)]
    offsets = {p.name: Path(p.log).stat().st_size for p in sinks}
    weed = running_pid(stack / "s3")
    assert weed is not None
    sent_before = producer.count()
    killed_at = time.monotonic()
    os.kill(weed, signal.SIGKILL)
    # the producer goes on into Kafka while the sinks' commits meet a dead S3
    wait_until(lambda: producer.count() >= sent_before + 50, 120, "the producer to go on while S3 is down")
    alive = {p.name: p.is_alive() for p in sinks}
    restarted_at = _up(stack)
    sent = producer.stop()
    held_at = _assert_whole(stack, reader, run, sent)
    retried = {p.name: _log_since(p.log, offsets[p.name]).count("did not answer a commit") for p in sinks}
    _report("SeaweedFS SIGKILLed during sink commits", s3_down_s=restarted_at - killed_at,
            caught_up_after_restart_s=held_at - restarted_at, sent=len(sent), sent_while_down=50,
            sinks_alive_before_restart=alive, commits_tried_again=retried,
            sinks_never_restarted={p.name: p.is_alive() for p in sinks})  # fmt: skip


def test_a_sink_killed_while_seaweedfs_is_down_leaves_the_other_to_store_everything(
    stack: Path, producers: list[Producer], tmp_path: Path
) -> None:
    """The group hands the dead sink's partitions to the live one while the store cannot answer:
    the live sink resumes them from the Delta log once it can, and stores every trajectory alone."""
    from trajlake.store.s3_server import S3Layout, S3ServerConfig, running_pid, start_s3

    run = "fault-s3-sink"
    s3_dir = stack / "s3"
    layout = S3Layout.load(s3_dir)
    producer, _, reader = _streaming(stack, run, tmp_path, producers, 5)
    live, dead = (_process(stack, f"sink-{i}") for i in (1, 2))
    offset = Path(live.log).stat().st_size
    weed = running_pid(s3_dir)
    assert layout is not None and weed is not None
    sent_before = producer.count()
    killed_at = time.monotonic()
    os.kill(weed, signal.SIGKILL)
    wait_until(lambda: producer.count() >= sent_before + 20, 120, "the producer to go on while S3 is down")
    os.killpg(dead.pid, signal.SIGKILL)
    wait_until(lambda: "partitions assigned" in _log_since(live.log, offset), 120,
               "the live sink to be given the dead one's partitions")  # fmt: skip
    reassigned_at = time.monotonic()
    wait_until(lambda: producer.count() >= sent_before + 40, 120, "the producer to go on after the rebalance")
    start_s3(S3ServerConfig(port=layout.port, data_dir=s3_dir))  # the store alone: the dead sink stays dead
    restarted_at = time.monotonic()
    sent = producer.stop()
    try:
        held_at = _assert_whole(stack, reader, run, sent)
    finally:
        _up(stack)  # the second sink back, for the tests after this one
    _report("a sink SIGKILLed while SeaweedFS is down", s3_down_s=restarted_at - killed_at,
            reassigned_while_down_after_s=reassigned_at - killed_at,
            caught_up_after_restart_s=held_at - restarted_at, sent=len(sent), live_sink_alive=live.is_alive())  # fmt: skip
