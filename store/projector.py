"""The projector: the one writer of a lake's projections, kept single by a fence in the Delta log.

Sinks commit `events` and their source offsets, nothing else; the projector follows `events`,
advances every projection from the position recorded with it (`projections.catch_up`) and
merges their files by size tier. Taking over writes a new epoch (`txn` app id
`trajlake-projector`) into every projection table, and each projection commit lands only
while its table still holds the projector's epoch: a projector another one took over from is
fenced off at its next commit, and nothing is projected twice. A killed projector's successor
resumes from the recorded positions.

`trajlake project` takes over when it starts. The embedded default runs one `ProjectorThread`
per lake and process beside its sinks; it takes over only a lake whose projector let go
(`release`, at its clean stop), never had one, or has committed nothing for
`takeover_after_s` while events waited (a killed one), and stands by otherwise.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa

from trajlake.common.threads import run_in_thread
from trajlake.schemas.tables import PROJECTION_TABLES
from trajlake.store import projections
from trajlake.store.compact import merge_tiers
from trajlake.store.config import ProjectorConfig
from trajlake.store.errors import CommitConflict, ProjectorFenced, TxnFenced
from trajlake.store.storage import through_outages

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

log = logging.getLogger(__name__)

EPOCH_APP_ID = "trajlake-projector"
"""The `txn` app id whose version, in every projection table, is the epoch of the projector that holds them."""
RELEASED_APP_ID = "trajlake-projector-released"
"""In `trajectories`: the epoch a projector let go of at its clean stop (equal to the epoch: free)."""
FRESHNESS_SAMPLES = 100_000


@dataclass
class ProjectorStats:
    """What a projector did, for logs, `trajlake project`'s report and bench/projector.py."""

    catch_ups: int = 0
    position: int = -1
    """The `events` version every projection reflects."""
    position_retries: int = 0
    """Catch-ups tried again because another writer moved a projection's position first."""
    takeovers: int = 0
    fenced: int = 0
    """Times another projector took over from this one."""
    files_merged: int = 0
    freshness_s: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=FRESHNESS_SAMPLES)
    )
    """Per events commit projected: seconds from it to the projection commit that made it visible."""


class Projector:
    """Advances the projections of one lake, as their single writer while it holds the epoch."""

    def __init__(self, lake: Lake, config: ProjectorConfig | None = None) -> None:
        self.lake = lake
        self.config = config or ProjectorConfig()
        self.epoch: int | None = None
        self.stats = ProjectorStats()

    def position(self) -> int:
        """The `events` version every projection reflects (-1: none yet)."""
        stored = [self.lake.txn_version(name, projections.APP_ID) for name in PROJECTION_TABLES]
        return min(-1 if p is None else p for p in stored)

    def take_over(self) -> int:
        """Write a new epoch into every projection table; return it. A projector holding an older
        one is fenced off at its next commit."""
        for attempt in range(100):
            current = {name: self.lake.txn_version(name, EPOCH_APP_ID) for name in PROJECTION_TABLES}
            epoch = max((e for e in current.values() if e is not None), default=0) + 1
            try:
                for name in PROJECTION_TABLES:
                    self.lake.commit(
                        name, [], {EPOCH_APP_ID: epoch}, expect_txns={EPOCH_APP_ID: current[name]}
                    )
            except TxnFenced:  # another projector is taking over at the same moment: outbid it
                log.info("another projector took over while this one did (attempt %d); again", attempt + 1)
                continue
            self.epoch = epoch
            self.stats.takeovers += 1
            log.info("projector epoch %d holds the projections of %s", epoch, self.lake.root)
            return epoch
        raise CommitConflict(
            f"could not take over the projections of {self.lake.root}", table_uri=self.lake.root
        )

    def may_take_over(self) -> bool:
        """True when no projector holds the lake: none ever did, the last one let go, or it has
        committed nothing for `takeover_after_s` (it was killed)."""
        epoch = self.lake.txn_version("trajectories", EPOCH_APP_ID)
        if epoch is None or self.lake.txn_version("trajectories", RELEASED_APP_ID) == epoch:
            return True
        return time.time() - self.lake.log.last_commit_time("trajectories") >= self.config.takeover_after_s

    def step(self, known: Mapping[str, pa.Table] | None = None) -> bool:
        """Project the `events` commits the projections lack, if this projector holds them (or may
        take them over); return whether it projected anything."""
        upto = self.lake.version("events")
        after = self.position()
        if upto <= after:
            self.stats.position = after
            return False
        if self.epoch is None:
            if not self.may_take_over():
                return False
            self.take_over()
        assert self.epoch is not None
        try:
            projections.catch_up(self.lake, known, fence={EPOCH_APP_ID: self.epoch}, on_retry=self._retried)
            self._merge()
        except ProjectorFenced as err:
            log.warning("projector epoch %d stands by: %s", self.epoch, err)
            self.epoch = None
            self.stats.fenced += 1
            return False
        self._measure(after, upto)
        return True

    def _step_through_outages(self) -> bool:
        """`step`, tried again while the store does not answer (a restart of the S3 server): a
        following projector waits out an outage as the sinks do (`STORE_OUTAGE_S`). Safe: each
        projection commit is fenced on the positions it builds on."""
        for tried in through_outages("a projection step"):
            with tried:
                return self.step()
        raise AssertionError("unreachable")

    def _retried(self) -> None:
        self.stats.position_retries += 1

    def _merge(self) -> None:
        """Merge each projection's files by size tier, while this projector still holds them."""
        if not self.config.merge_fanin:
            return
        for name in PROJECTION_TABLES:
            try:
                self.lake.check_txns(name, {EPOCH_APP_ID: self.epoch})
            except TxnFenced as err:  # merging is the holder's work too
                raise ProjectorFenced(str(err), table_uri=err.table_uri) from None
            removed, _, _ = merge_tiers(self.lake, name, self.config.merge_fanin)
            self.stats.files_merged += removed

    def _measure(self, after: int, upto: int) -> None:
        now = time.time()
        self.stats.catch_ups += 1
        self.stats.position = upto
        for committed in self.lake.log.commit_times("events", after, upto).values():
            self.stats.freshness_s.append(max(0.0, now - committed))

    def release(self) -> None:
        """Let go of the projections (a clean stop): a standby may take them over at once."""
        if self.epoch is None:
            return
        with contextlib.suppress(TxnFenced):  # another one holds them already
            self.lake.commit(
                "trajectories", [], {RELEASED_APP_ID: self.epoch}, expect_txns={EPOCH_APP_ID: self.epoch}
            )
        self.epoch = None

    def run(self, follow: bool = False, stop: threading.Event | None = None) -> ProjectorStats:
        """Take over and catch up; with `follow`, keep following `events` until `stop` is set."""
        stop = stop or threading.Event()
        self.take_over()
        self._step_through_outages()
        while follow and not stop.is_set():
            if self.epoch is None:
                raise ProjectorFenced(
                    f"another projector took over the projections of {self.lake.root}; this one stops"
                )
            if not self._step_through_outages():
                stop.wait(self.config.poll_interval_s)
        self.release()
        return self.stats


class ProjectorThread:
    """The embedded default's projector: one per lake and process, on a thread of its own, woken by
    each events commit of the process's sinks (`offer`), which hand over the rows they wrote."""

    _shared: ClassVar[dict[str, ProjectorThread]] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def acquire(cls, lake: Lake, config: ProjectorConfig | None = None) -> ProjectorThread:
        """The running projector thread of `lake`'s root in this process (started on first use)."""
        with cls._shared_lock:
            thread = cls._shared.get(lake.root)
            if thread is None or thread.stopped:
                thread = cls._shared[lake.root] = cls(lake, config)
            thread.users += 1
            return thread

    def __init__(self, lake: Lake, config: ProjectorConfig | None = None) -> None:
        self.projector = Projector(lake, config)
        self.users = 0
        self.stopped = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._known: dict[str, pa.Table] = {}
        self.job = run_in_thread(self._loop, name="trajlake-projector")

    def offer(self, known: Mapping[str, pa.Table]) -> None:
        """Events files a sink just committed, by relative path: project them (without reading them back)."""
        with self._progress:
            self._known.update(known)
        self._wake.set()

    def _loop(self) -> None:
        interval = self.projector.config.poll_interval_s
        try:
            while not self._stop.is_set():
                self._wake.wait(interval)
                self._wake.clear()
                with self._progress:
                    known, self._known = self._known, {}
                self.projector.step(known)
                with self._progress:
                    self._progress.notify_all()
        finally:
            with self._progress:
                self._progress.notify_all()

    def wait(self, version: int) -> None:
        """Block until every projection reflects `events` version `version` (whoever projects it)."""
        self._wake.set()
        with self._progress:
            while self.projector.stats.position < version:
                if self.job.done():
                    self.job.result()  # the projector's own error, in the caller's thread
                    raise RuntimeError("the projector thread stopped")
                self._progress.wait(self.projector.config.poll_interval_s)
                self.projector.stats.position = max(self.projector.stats.position, self.projector.position())

    def release(self) -> None:
        """One user is done: the last one catches up, stops the thread and lets go of the projections."""
        with self._shared_lock:
            self.users -= 1
            if self.users > 0:
                return
            self.stopped = True
            if self._shared.get(self.projector.lake.root) is self:
                del self._shared[self.projector.lake.root]
        self.wait(self.projector.lake.version("events"))
        self._stop.set()
        self._wake.set()
        self.job.result()
        self.projector.release()
