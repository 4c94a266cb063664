"""The seqs already stored per trajectory, with their event ids, so the sink tells an event delivered
again (a replay) from another event that takes a stored seq (a conflict) across batches."""

from __future__ import annotations

from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schemas.events import TRAJECTORY_EVENT_TYPES
from trajlake.store.lake import Lake


class SeqCache:
    """Per trajectory, the seqs stored so far and their event ids; the least recently used
    trajectories are forgotten (and read back from the lake when they show up again)."""

    def __init__(self, lake: Lake, limit: int) -> None:
        self.lake = lake
        self.limit = limit
        self._seqs: OrderedDict[str, dict[int, str]] = OrderedDict()

    def known(self, batch: pa.Table) -> dict[str, dict[int, str]]:
        """Stored seqs (-> event ids) of the batch's trajectories, those that start in it too: a
        message delivered again may hold a trajectory's start. Read from the files whose Delta
        statistics may hold their ids (time-ordered ids keep new ones out of all but the last)."""
        if not batch.num_rows:
            return {}
        tids, types = batch.column("trajectory_id"), batch.column("event_type")
        of_trajectories = pc.is_in(types, value_set=pa.array(sorted(TRAJECTORY_EVENT_TYPES)))
        wanted = set(pc.unique(pc.filter(tids, of_trajectories)).to_pylist()) - {None, ""}
        missing = sorted(t for t in wanted if t not in self._seqs)
        if missing:
            for t in missing:
                self._seqs[t] = {}
            # new trajectories' ids lie past every stored file's: then the statistics alone say so
            if self.lake.file_stats("events", ("trajectory_id", missing[0], missing[-1])).num_rows:
                columns = ["trajectory_id", "seq", "event_id"]
                self._add(self.lake.read("events", columns, among=("trajectory_id", missing)))
        known = {t: self._seqs[t] for t in wanted if t in self._seqs}
        self._trim()
        return known

    def forget(self) -> None:
        """Forget every trajectory: partitions moved, so another sink may have stored seqs of
        trajectories cached here (a replay of those would otherwise pass as new events)."""
        self._seqs.clear()

    def remember(self, rows: pa.Table) -> None:
        """Add the seqs of rows just committed."""
        if self.limit and rows.num_rows:
            self._add(rows)
            self._trim()

    def _add(self, rows: pa.Table) -> None:
        keyed = rows.select(["trajectory_id", "seq", "event_id"]).drop_null()
        grouped = keyed.group_by("trajectory_id", use_threads=False).aggregate(
            [("seq", "list"), ("event_id", "list")]
        )
        for t, seqs, ids in zip(
            grouped.column("trajectory_id").to_pylist(),
            grouped.column("seq_list").to_pylist(),
            grouped.column("event_id_list").to_pylist(),
            strict=True,
        ):
            seen = self._seqs.get(t)
            if seen is None:
                seen = self._seqs[t] = {}
            else:
                self._seqs.move_to_end(t)
            seen.update(zip(seqs, ids, strict=True))

    def _trim(self) -> None:
        while len(self._seqs) > self.limit:
            self._seqs.popitem(last=False)
