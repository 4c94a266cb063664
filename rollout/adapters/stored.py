"""What a producer stored, read back from the lake: the figures its user checks (status, reward, tokens).

An example (or a harness) counts what it sent; the lake is what a trainer reads. The two differ
where it matters: a rollout the framework returned with reward 0 may be a system failure with no
reward in the lake, and the lake counts a trajectory's tokens as it stores them (prompt, outputs
and every appended environment token). So a producer reports from here, by its `producer_id`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from trajlake.store.lake import Lake

STORED_SQL = """
select t.trajectory_id, t.status, t.failure_origin, t.failure_label, t.reward, t.total_tokens, t.n_turns,
  t.message
from trajectories t
where t.run_id = $run and t.trajectory_id in (
  select trajectory_id from events where run_id = $run and producer_id = $producer
    and event_type = 'trajectory_started')
order by t.started_at, t.trajectory_id
"""


@dataclass
class StoredTrajectories:
    """The trajectories one producer stored in a run, as the lake holds them."""

    run_id: str
    producer_id: str
    rows: list[dict[str, Any]]

    @classmethod
    def read(cls, lake: Lake, run_id: str, producer_id: str) -> StoredTrajectories:
        """Read them back (every trajectory the producer started in the run)."""
        rows = lake.sql(STORED_SQL, {"run": run_id, "producer": producer_id}).to_pylist()
        return cls(run_id, producer_id, rows)

    @property
    def usable(self) -> list[dict[str, Any]]:
        """Finished without a system failure: the model's outcome was recorded (a trainer may use it)."""
        return [r for r in self.rows if r["status"] is not None and r["failure_origin"] != "system"]

    @property
    def tokens(self) -> int:
        return sum(r["total_tokens"] or 0 for r in self.rows)

    def render(self) -> str:
        """Lines for a person: totals, outcomes by status, rewards, and why the system failures failed."""
        statuses = Counter(
            f"{r['status'] or 'unfinished'}"
            + (f" ({r['failure_origin']}: {r['failure_label']})" if r["failure_origin"] else "")
            for r in self.rows
        )
        rewards = [r["reward"] for r in self.rows]
        lines = [
            f"the lake holds {len(self.rows)} trajectories of this run in {self.run_id!r}, {self.tokens} tokens "
            f"as it counts them; {len(self.usable)} usable (finished without a system failure)",
            "  status: " + ", ".join(f"{n} {s}" for s, n in statuses.most_common()),
            "  rewards: " + (", ".join("none" if r is None else f"{r:g}" for r in rewards) or "none"),
        ]
        why = {
            r["failure_label"]: r["message"] or "no message"
            for r in self.rows
            if r["failure_origin"] == "system"
        }
        lines += [f"  {label}: {_ends(' '.join(message.split()))}" for label, message in why.items()]
        return "\n".join(lines)

    def exit_code(self, dead_letters: int = 0) -> int:
        """0 when something usable was stored and nothing went to dead letters, else 1."""
        return 0 if self.usable and not dead_letters else 1


def _ends(text: str, width: int = 300) -> str:
    """`text` within `width`: its head and its tail (a traceback ends with its cause)."""
    return text if len(text) <= width else f"{text[: width // 3]} … {text[-(2 * width // 3) :]}"
