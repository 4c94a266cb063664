"""`trajlake rescore`: run a verifier again on stored trajectories and append its rewards, with its version.

Nothing is re-run: the verifier judges each trajectory from what the lake holds (`StoredTrajectory`:
turns, tool calls, final answer, artifacts). Its rewards are new `reward` events, with
`verifier_version` set, through the usual write path (bus -> sink: validated, exactly once); the
rewards recorded before stay in `events` and `rewards`, and `trajectories.reward` becomes the latest.
A verifier that raises records a `verifier_error` (no reward), never a 0. Trajectories the version
already scored are skipped, so a re-score stopped halfway and run again scores each one once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.stored import EVENT_COLUMNS, StoredTrajectory, from_events
from trajlake.schemas.errors import CliError
from trajlake.schemas.events import REWARD, make_event
from trajlake.schemas.settings import DEFAULT_SUCCESS_THRESHOLD
from trajlake.store.rewards import RESERVED

if TYPE_CHECKING:
    from trajlake.rollout.config import RescoreSettings
    from trajlake.store.lake import Lake

Verifier = Callable[[StoredTrajectory], Any]
PRODUCER = "trajlake-rescore"


@dataclass(frozen=True)
class Score:
    """What a verifier may return instead of a bare number: the reward, its parts, or why it could not score."""

    reward: float | None
    components: Mapping[str, float] | None = None
    error: str | None = None


@dataclass
class RescoreReport:
    """What a re-score did, and how its rewards compare with each trajectory's previous latest one."""

    run_id: str
    verifier: str
    verifier_version: str
    selected: int = 0
    skipped: int = 0
    """Already scored by this version (an earlier, stopped re-score)."""
    scored: int = 0
    errors: int = 0
    changed: int = 0
    fail_to_pass: int = 0
    pass_to_fail: int = 0
    newly_scored: int = 0
    """Had no valid reward before (e.g. the verifier crashed), have one now."""
    threshold: float = 1.0
    dead_letters: int = 0
    error_examples: list[str] = field(default_factory=list)
    flips: list[dict[str, Any]] = field(default_factory=list)
    """The trajectories whose pass/fail changed: trajectory_id, task_id, the reward before and now."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_verifier(spec: str) -> tuple[Verifier, str]:
    """The function `spec` names (`package.module:function`, or `path/to/file.py:function`) and its name."""
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise CliError(f"--verifier {spec!r} is not MODULE:FUNC; e.g. trajlake.demo.verifiers:exact_match")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise CliError(f"--verifier {spec!r}: no file {path}")
            loader = importlib.util.spec_from_file_location(f"trajlake_verifier_{path.stem}", path)
            assert loader is not None and loader.loader is not None
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as err:
        raise CliError(
            f"--verifier {spec!r}: cannot import {module_name} ({err}); put it on PYTHONPATH or pass a .py file"
        ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise CliError(f"--verifier {spec!r}: {module_name} has no function {func_name!r}")
    return func, spec


def default_version(func: Verifier) -> str:
    """A verifier's version when none is given: its `version` attribute, else its name and a hash of its
    source (a changed verifier gets a new version)."""
    own = getattr(func, "version", None)
    if own:
        return str(own)
    try:
        source = inspect.getsource(inspect.getmodule(func) or func)
    except (OSError, TypeError):
        source = getattr(func, "__qualname__", repr(func))
    return f"{getattr(func, '__name__', 'verifier')}@{hashlib.sha256(source.encode()).hexdigest()[:8]}"


def judge(func: Verifier, traj: StoredTrajectory) -> Score:
    """The verifier's score of one trajectory; an exception or no answer is a verifier error, never a 0."""
    try:
        out = func(traj)
    except Exception as err:  # the verifier's own bug or a missing artifact: recorded, the re-score goes on
        return Score(None, error=f"{type(err).__name__}: {err}"[:2000])
    if isinstance(out, Score):
        return out
    if isinstance(out, bool | int | float):
        return Score(float(out))
    if isinstance(out, Mapping) and out:
        parts = {str(k): float(v) for k, v in out.items()}
        return Score(parts.get("reward", sum(parts.values())), parts)
    return Score(None, error=f"the verifier returned {out!r}: return a number, a dict of parts or a Score")


def select(lake: Lake, run_id: str, sql: str | None) -> list[str]:
    """The run's finished trajectories (those `sql`, a SELECT returning trajectory_id, also returns)."""
    where = "run_id = $run and finished"
    if sql:
        query = sql.strip().rstrip(";")
        columns = lake.sql(f"select * from ({query}\n) limit 0").column_names
        if "trajectory_id" not in columns:
            raise CliError(
                f"--sql returns no trajectory_id column (it returns {', '.join(columns)}); select it"
            )
        where += f" and trajectory_id in (select trajectory_id from ({query}\n))"
    ids = lake.sql(
        f"select trajectory_id from trajectories where {where} order by trajectory_id", {"run": run_id}
    )
    return ids.column("trajectory_id").to_pylist()


def already_scored(lake: Lake, run_id: str, version: str) -> set[str]:
    """Trajectories of the run that `version` scored already."""
    if not lake.exists("rewards"):
        return set()
    rows = lake.read("rewards", ["trajectory_id"], "run_id = ? and verifier_version = ?", [run_id, version])
    return set(rows.column("trajectory_id").to_pylist())


def stored_trajectories(
    lake: Lake, run_id: str, ids: Sequence[str], tokenizer: str | None, chunk: int
) -> Iterator[StoredTrajectory]:
    """The trajectories `ids` of the run as verifiers see them, read `chunk` at a time."""
    for at in range(0, len(ids), chunk):
        part = sorted(ids[at : at + chunk])
        rows = lake.read("events", EVENT_COLUMNS, "run_id = ?", [run_id], among=("trajectory_id", part))
        by_id: dict[str, list[dict[str, Any]]] = {}
        for row in rows.to_pylist():
            by_id.setdefault(row["trajectory_id"], []).append(row)
        for tid in part:
            if tid in by_id:
                yield from_events(by_id[tid], tokenizer, lake)


def rescore(
    lake: Lake,
    run_id: str,
    settings: RescoreSettings,
    *,
    threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    tokenizer: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RescoreReport:
    """Re-score the run's selected trajectories with `settings.verifier`; return what it did. `threshold`:
    where a reward passes (the report's flips); `progress(done, total)` after each trajectory."""
    func, name = load_verifier(settings.verifier)
    version = settings.verifier_version or default_version(func)
    if version in RESERVED:
        raise CliError(
            f"--verifier-version {version!r} is reserved (it chooses a version); name yours otherwise"
        )
    report = RescoreReport(run_id, name, version, threshold=threshold)
    ids = select(lake, run_id, settings.sql)
    done = already_scored(lake, run_id, version)
    report.selected, report.skipped = len(ids), sum(t in done for t in ids)
    todo = [t for t in ids if t not in done]
    bus = InProcessBus(topic=f"rescore-{run_id}")
    for i, traj in enumerate(stored_trajectories(lake, run_id, todo, tokenizer, settings.batch)):
        score = judge(func, traj)
        _count(report, traj, score, threshold)
        bus.publish([make_event(
            REWARD, run_id, trajectory_id=traj.trajectory_id, seq=traj.last_seq + 1, producer_id=PRODUCER,
            reward=score.reward, reward_components=dict(score.components) if score.components else None,
            verifier=name, verifier_version=version, verifier_error=score.error,
        )])  # fmt: skip
        if (i + 1) % settings.batch == 0:
            report.dead_letters += _drain(lake, bus)
        if progress is not None:
            progress(i + 1, len(todo))
    report.dead_letters += _drain(lake, bus)
    return report


def _count(report: RescoreReport, traj: StoredTrajectory, score: Score, threshold: float) -> None:
    before = traj.reward
    if score.error is not None or score.reward is None:
        report.errors += 1
        if len(report.error_examples) < 5:
            report.error_examples.append(score.error or "no reward")
        return
    report.scored += 1
    report.changed += before != score.reward
    if before is None:
        report.newly_scored += 1
    elif before >= threshold > score.reward:
        report.pass_to_fail += 1
    elif score.reward >= threshold > before:
        report.fail_to_pass += 1
    if before is None or (before >= threshold) != (score.reward >= threshold):
        report.flips.append({"trajectory_id": traj.trajectory_id, "task_id": traj.task_id, "before": before,
                             "after": score.reward})  # fmt: skip


def _drain(lake: Lake, bus: InProcessBus) -> int:
    """Commit what the bus holds (a throwaway topic: its offsets are not kept); return its dead letters."""
    if not bus.pending():
        return 0
    stats = DeltaSink(lake, bus, SinkConfig(max_latency_s=60, exactly_once=False)).run(until_idle_s=0.0)
    if stats.dead_letters:
        print(f"rescore: {stats.dead_letters} reward events went to dead_letters", file=sys.stderr)
    return int(stats.dead_letters)
