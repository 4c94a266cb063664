"""The seqs already stored per trajectory, so the sink rejects an event repeated across batches."""

from __future__ import annotations

from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schemas.events import TRAJECTORY_EVENT_TYPES
from trajlake.store.lake import Lake


class SeqCache:
    """Per trajectory, the seqs stored so far; the least recently used trajectories are forgotten
    (and read back from the lake when they show up again)."""

    def __init__(self, lake: Lake, limit: int) -> None:
        self.lake = lake
        self.limit = limit
        self._seqs: OrderedDict[str, set[int]] = OrderedDict()

    def known(self, batch: pa.Table) -> dict[str, set[int]]:
        """Stored seqs of the batch's trajectories that did not start in this batch."""
        if not batch.num_rows:
            return {}
        tids, types = batch.column("trajectory_id"), batch.column("event_type")
        starts = pc.and_(pc.equal(types, "trajectory_started"), pc.equal(batch.column("seq"), 0))
        started = set(pc.unique(pc.filter(tids, starts)).to_pylist())
        of_trajectories = pc.is_in(types, value_set=pa.array(sorted(TRAJECTORY_EVENT_TYPES)))
        wanted = set(pc.unique(pc.filter(tids, of_trajectories)).to_pylist()) - started - {None, ""}
        missing = [t for t in wanted if t not in self._seqs]
        if missing:
            stored = self.lake.read("events", ["trajectory_id", "seq"], among=("trajectory_id", missing))
            for t in missing:
                self._seqs[t] = set()
            self._add(stored)
        known = {t: self._seqs[t] for t in wanted if t in self._seqs}
        self._trim()
        return known

    def remember(self, rows: pa.Table) -> None:
        """Add the seqs of rows just committed."""
        if self.limit and rows.num_rows:
            self._add(rows)
            self._trim()

    def _add(self, rows: pa.Table) -> None:
        pairs = rows.select(["trajectory_id", "seq"]).drop_null()
        grouped = pairs.group_by("trajectory_id", use_threads=False).aggregate([("seq", "list")])
        for t, seqs in zip(
            grouped.column("trajectory_id").to_pylist(), grouped.column("seq_list").to_pylist(), strict=True
        ):
            seen = self._seqs.get(t)
            if seen is None:
                seen = self._seqs[t] = set()
            else:
                self._seqs.move_to_end(t)
            seen.update(seqs)

    def _trim(self) -> None:
        while len(self._seqs) > self.limit:
            self._seqs.popitem(last=False)
