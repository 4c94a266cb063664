"""What a verifier sees when it re-scores a stored trajectory: the trajectory as the lake holds it.

`StoredTrajectory` is built from a trajectory's events alone: what it attempted (task, environment,
its `trajectory_started` attributes), every turn's token ids, every tool call with its outcome, how
it ended with the final answer it submitted and the artifacts it left (`trajectory_finished`), and
its rewards so far. A verifier is a function `StoredTrajectory -> reward` (see `rescore.Score`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajlake.schemas.fields import (
    REWARD,
    TOOL_CALL,
    TOOL_RESULT,
    TRAJECTORY_FINISHED,
    TRAJECTORY_STARTED,
    TURN,
)
from trajlake.store.artifacts import read_artifact
from trajlake.store.errors import LakeError

EVENT_COLUMNS = (
    "run_id", "trajectory_id", "seq", "event_type", "task_id", "group_id", "sample_index", "environment",
    "harness", "model", "tags", "attributes", "turn_index", "policy_version", "input_token_ids", "input_is_full",
    "output_token_ids", "finish_reason", "call_id", "tool_name", "arguments", "is_code_execution", "ok",
    "error_type", "timed_out", "truncated", "output_tokens", "reward", "reward_components", "verifier",
    "verifier_version", "verifier_error", "status", "failure_origin", "failure_label", "message",
    "final_answer", "artifacts",
)  # fmt: skip
"""The `events` columns a stored trajectory is built from (no logprobs: a verifier judges what was done)."""


class ArtifactError(LakeError):
    """An artifact a verifier asked for is not in the trajectory's manifest, or is not as recorded."""


@dataclass(frozen=True)
class StoredTurn:
    """One model turn: what it appended to the context and what the model sampled."""

    turn_index: int
    policy_version: int | None
    input_token_ids: list[int]
    output_token_ids: list[int]
    input_is_full: bool = False
    finish_reason: str | None = None


@dataclass(frozen=True)
class StoredToolCall:
    """One tool call with its outcome (None where no result arrived)."""

    call_id: str
    tool_name: str
    arguments: Any
    ok: bool | None
    error_type: str | None
    timed_out: bool | None
    truncated: bool | None
    output_tokens: int | None
    is_code_execution: bool = False


@dataclass
class StoredTrajectory:
    """One trajectory as the lake holds it, for a verifier to judge again."""

    run_id: str
    trajectory_id: str
    task_id: str | None = None
    group_id: str | None = None
    environment: str | None = None
    harness: str | None = None
    model: str | None = None
    tags: list[str] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)
    """The `trajectory_started` attributes (an importer's source record: e.g. Harbor's trial name)."""
    turns: list[StoredTurn] = field(default_factory=list)
    tool_calls: list[StoredToolCall] = field(default_factory=list)
    status: str | None = None
    failure_origin: str | None = None
    failure_label: str | None = None
    message: str | None = None
    final_answer: str | None = None
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    """The manifest the episode recorded: {name, uri, bytes, sha256} per file (`artifact()` reads one)."""
    rewards: list[dict[str, Any]] = field(default_factory=list)
    """Its reward events so far, oldest first: reward, reward_components, verifier, verifier_version, verifier_error."""
    last_seq: int = -1
    tokenizer: str | None = None
    lake: Any = None

    @property
    def reward(self) -> float | None:
        """Its latest reward (None: none, or the latest verifier could not score)."""
        return self.rewards[-1]["reward"] if self.rewards else None

    @property
    def token_ids(self) -> list[int]:
        """The whole sequence as the engine saw it: prompt, outputs and appended input, in order (from the
        last turn that stored its full input, as `trajectories.token_ids`)."""
        start = max((i for i, t in enumerate(self.turns) if t.input_is_full), default=0)
        return [tok for t in self.turns[start:] for tok in (*t.input_token_ids, *t.output_token_ids)]

    @property
    def prompt_token_ids(self) -> list[int]:
        """The first turn's input: the task's prompt."""
        return list(self.turns[0].input_token_ids) if self.turns else []

    def text(self, token_ids: Sequence[int]) -> str:
        """Token ids as text, with the run's tokenizer (or the `--tokenizer` override)."""
        from trajlake.store.tokenizer import find_decoder

        return find_decoder(self.model, self.tokenizer)(token_ids)

    def artifact(self, name: str) -> bytes:
        """The bytes of artifact `name` from the manifest, checked against its recorded sha256."""
        entry = next((a for a in self.artifacts if a.get("name") == name), None)
        if entry is None:
            names = ", ".join(a.get("name", "?") for a in self.artifacts) or "none"
            raise ArtifactError(
                f"trajectory {self.trajectory_id} recorded no artifact {name!r} (it has: {names})"
            )
        data = read_artifact(self.lake, entry)
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise ArtifactError(
                f"artifact {name!r} at {entry.get('uri')} is not the file the episode left (sha256 differs)"
            )
        return data


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value else value


def from_events(
    rows: Sequence[Mapping[str, Any]], tokenizer: str | None = None, lake: Any = None
) -> StoredTrajectory:
    """A stored trajectory from its events' `EVENT_COLUMNS` rows (any order)."""
    rows = sorted(rows, key=lambda r: r["seq"])
    first = rows[0]
    traj = StoredTrajectory(first["run_id"], first["trajectory_id"], tokenizer=tokenizer, lake=lake)
    results = {r["call_id"]: r for r in rows if r["event_type"] == TOOL_RESULT}
    for r in rows:
        kind = r["event_type"]
        traj.last_seq = max(traj.last_seq, r["seq"])
        if kind == TRAJECTORY_STARTED:
            traj.task_id, traj.group_id, traj.environment = r["task_id"], r["group_id"], r["environment"]
            traj.harness, traj.model, traj.tags = r["harness"], r["model"], list(r["tags"] or [])
            traj.attributes = _json(r["attributes"]) or {}
        elif kind == TURN:
            traj.turns.append(StoredTurn(r["turn_index"], r["policy_version"], list(r["input_token_ids"] or []),
                                         list(r["output_token_ids"] or []), bool(r["input_is_full"]),
                                         r["finish_reason"]))  # fmt: skip
        elif kind == TOOL_CALL:
            res = results.get(r["call_id"]) or {}
            traj.tool_calls.append(StoredToolCall(
                r["call_id"], r["tool_name"], _json(r["arguments"]), res.get("ok"), res.get("error_type"),
                res.get("timed_out"), res.get("truncated"), res.get("output_tokens"), bool(r["is_code_execution"]),
            ))  # fmt: skip
        elif kind == REWARD:
            traj.rewards.append({k: _json(r[k]) if k == "reward_components" else r[k] for k in
                                 ("reward", "reward_components", "verifier", "verifier_version", "verifier_error")})  # fmt: skip
        elif kind == TRAJECTORY_FINISHED:
            traj.status, traj.failure_origin = r["status"], r["failure_origin"]
            traj.failure_label, traj.message = r["failure_label"], r["message"]
            traj.final_answer, traj.artifacts = r["final_answer"], _json(r["artifacts"]) or []
    return traj
