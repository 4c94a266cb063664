"""What every importer shares: the write path (Recorder -> InProcessBus -> DeltaSink) and its report.

Imported trajectories go through the same path as live ones, so ingest validation applies
and a record that breaks an invariant lands in `dead_letters` instead of vanishing.
Trajectory ids are derived from the source record, so importing the same data again adds
nothing: trajectories already in the lake for this run are skipped.

A stop (SIGINT/SIGTERM, `trajlake.ingest.shutdown`) never cuts a record in half: each is
recorded inside `ImportSession.recording()` and each drain is whole, and the session commits
what it recorded before the process ends, so an import stopped and run again stores everything once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from trajlake.ingest import shutdown
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store.lake import Lake

_NAMESPACE = uuid.UUID("6b1f3c2e-4d5a-4e8f-9a0b-7c6d5e4f3a2b")


def stable_trajectory_id(run_id: str, source: str, key: str) -> str:
    """The same id every time the same source record is imported into the same run."""
    return str(uuid.uuid5(_NAMESPACE, f"{run_id}\x00{source}\x00{key}"))


@dataclass
class RecordedTrajectory:
    """What recording one source record (a trial, a trace) as a trajectory did."""

    trajectory_id: str
    turns: int = 0
    tokens: int = 0
    tool_calls: int = 0
    warnings: list[str] = field(default_factory=list)


@dataclass
class ImportReport:
    """What an import did."""

    source: str
    run_id: str
    trajectories: int = 0
    skipped_existing: int = 0
    turns: int = 0
    tool_calls: int = 0
    events: int = 0
    dead_letters: int = 0
    warnings: list[str] = field(default_factory=list)
    stopped_by: str | None = None  # the signal that stopped it (SIGINT, SIGTERM) before it was done

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


class ImportSession:
    """Records imported trajectories and drains them into the lake every `batch` trajectories."""

    def __init__(
        self,
        lake: Lake,
        run_id: str,
        source: str,
        *,
        vocab_size: int | None = None,
        batch: int = 200,
        policy_version: int | None = None,
        producer_id: str | None = None,
    ) -> None:
        self.lake = lake
        self.policy_version = policy_version  # of turns whose source records none; None: unknown
        self.bus = InProcessBus(topic=f"import-{source}")
        # one bus message per trajectory: it lands in one lake commit, so an import killed
        # between commits never leaves half a trajectory that a rerun would take as imported
        self.recorder = Recorder(
            self.bus,
            run_id,
            producer_id=producer_id or f"trajlake-import-{source}",
            vocab_size=vocab_size,
            flush_each_turn=False,
        )
        self.report = ImportReport(source=source, run_id=run_id)
        self.batch = batch
        self._since_drain = 0
        self._existing = self._existing_ids(run_id)
        self._committed = 0  # trajectories in the lake from this session
        shutdown.hold(self, shutdown.COMMIT)

    def _existing_ids(self, run_id: str) -> set[str]:
        # from `events`, not the `trajectories` projection: an import killed after an events
        # commit and before the projection caught up has stored trajectories the projection lacks
        if not self.lake.exists("events"):
            return set()
        rows = self.lake.read(
            "events",
            columns=["trajectory_id"],
            where="run_id = $run and event_type = 'trajectory_started'",
            params={"run": run_id},
        )
        return set(rows.column("trajectory_id").to_pylist())

    def already_imported(self, trajectory_id: str) -> bool:
        """True (and counted) when this trajectory is in the lake from an earlier import."""
        if trajectory_id in self._existing:
            self.report.skipped_existing += 1
            return True
        return False

    def recording(self) -> shutdown.deferred:
        """The block that records one source record: a stop waits for its end (whole or not at all)."""
        return shutdown.deferred()

    def done_one(self, trajectory_id: str | None = None) -> None:
        """Count a recorded trajectory (remembered, when its id is given); drain every `batch` of them."""
        if trajectory_id is not None:  # a source that replays records within one session skips it
            self._existing.add(trajectory_id)
        self.report.trajectories += 1
        self._since_drain += 1
        if self._since_drain >= self.batch:
            self.drain()

    def drain(self) -> None:
        """Move everything recorded so far into the lake (whole: a stop waits for it)."""
        self._since_drain = 0
        if not self.bus.pending():
            return
        # the import is idempotent through its trajectory ids; offsets of a throwaway in-process
        # topic must not be stored, or a later import on a fresh bus would seek past its own events
        with shutdown.deferred():
            sink = DeltaSink(self.lake, self.bus, SinkConfig(max_latency_s=60, exactly_once=False))
            stats = sink.run(until_idle_s=0.0)
            self.report.events += stats.events
            self.report.dead_letters += stats.dead_letters
            self._committed = self.report.trajectories

    def close(self, stop: shutdown.StopRequested | None = None) -> ImportReport:
        """Drain what is left and return the report (`stop`: the signal that ended the import early)."""
        self.drain()
        shutdown.release(self)
        if stop is not None:
            self.report.stopped_by = stop.name
        return self.report

    def settle(self, deadline: float) -> str | None:
        """A stop that ended the import early: commit what it recorded (`shutdown.Holder`)."""
        held = self.report.trajectories - self._committed
        self.drain()
        return (
            f"{self.report.source} import into run {self.report.run_id}: committed the {held:,} trajectories "
            f"it held; the lake at {self.lake.root} has all {self.report.trajectories:,} it imported (import "
            "again for the rest: what is stored is skipped)"
        )
