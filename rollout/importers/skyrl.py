"""Import SkyRL `GeneratorOutput` dumps: one trajectory per sample, token ids as generated.

A `GeneratorOutput` (skyrl_train/generators/base.py) is column-oriented: `prompt_token_ids`,
`response_ids`, `loss_masks`, `rollout_logprobs` (optional), `rewards` (a scalar per sample
or one value per response token), `stop_reasons`, `trajectory_ids` (`instance_id`,
`repetition_id`) and, for step-wise training, `is_last_step`. Accepted files:

- `.json`: one GeneratorOutput object, or a list of them;
- `.jsonl`: one GeneratorOutput object per line, or one sample per line (the same keys with
  a single sample's values, e.g. `"response_ids": [1, 2]`);
- `.pkl` / `.pickle`: a pickled GeneratorOutput (or list); SkyRL's `TrajectoryID` objects are
  read without importing skyrl_train. Only import pickles you trust.

A multi-turn response interleaves model tokens (loss mask 1) and environment tokens (mask 0);
it is split at mask changes into turns whose outputs are the masked-in runs and whose inputs
are the environment runs, so `assistant_tokens` and `env_tokens` mean the same as for live
rollouts. Step-wise samples sharing a trajectory id become the turns of one trajectory.
Without `rollout_logprobs` the tokens are kept but masked out of the loss (mask 0), since
an off-policy correction needs the sampling logprobs; the same rule as the Harbor importer.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajlake.rollout import taxonomy
from trajlake.rollout.errors import ImportFormatError
from trajlake.rollout.importers.base import ImportReport, ImportSession, stable_trajectory_id
from trajlake.store.lake import Lake

COLUMNS = (
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "stop_reasons",
    "rollout_logprobs",
    "trajectory_ids",
    "is_last_step",
)


@dataclass
class SkyrlStep:
    """One row of a GeneratorOutput."""

    prompt_token_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int] | None
    logprobs: list[float] | None
    reward: float | list[float] | None
    stop_reason: str | None
    instance_id: str | None
    repetition_id: int | None
    is_last_step: bool = True


@dataclass
class SkyrlTrajectory:
    """The steps of one (instance_id, repetition_id)."""

    instance_id: str
    repetition_id: int
    steps: list[SkyrlStep] = field(default_factory=list)


class _Stub:
    """Stands in for skyrl_train classes (TrajectoryID, ...) when unpickling without skyrl_train."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple):  # (dict, slots) for slotted dataclasses
            state = {k: v for part in state if isinstance(part, dict) for k, v in part.items()}
        self.__dict__.update(state or {})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in ("skyrl_train", "skyrl", "skyrl_gym"):
            return type(name, (_Stub,), {})
        return super().find_class(module, name)


def load_outputs(path: Path) -> list[Mapping[str, Any]]:
    """The GeneratorOutput objects (or single-sample rows) in a dump file."""
    suffix = path.suffix.lower()
    try:
        if suffix in (".pkl", ".pickle"):
            with path.open("rb") as fh:
                data = _Unpickler(fh).load()
        elif suffix == ".jsonl":
            data = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        elif suffix == ".json":
            data = json.loads(path.read_text())
        else:
            raise ImportFormatError(
                "unknown file type; pass a .json, .jsonl or .pkl GeneratorOutput dump", path=str(path)
            )
    except (OSError, json.JSONDecodeError, pickle.UnpicklingError, EOFError) as err:
        raise ImportFormatError(f"cannot read the dump ({err})", path=str(path)) from err
    items = data if isinstance(data, list) else [data]
    for item in items:
        if not isinstance(item, Mapping) or "response_ids" not in item or "prompt_token_ids" not in item:
            raise ImportFormatError(
                "not a SkyRL GeneratorOutput (needs prompt_token_ids and response_ids)", path=str(path)
            )
    return items


def _tolist(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _ids_of(tid: Any) -> tuple[str | None, int | None]:
    if tid is None:
        return None, None
    if isinstance(tid, Mapping):
        return str(tid.get("instance_id")), int(tid.get("repetition_id", 0))
    if hasattr(tid, "instance_id"):
        return str(tid.instance_id), int(getattr(tid, "repetition_id", 0))
    if isinstance(tid, str) and "_" in tid:  # TrajectoryID.to_string(): f"{instance_id}_{repetition_id}"
        head, _, tail = tid.rpartition("_")
        if tail.isdigit():
            return head, int(tail)
    return str(tid), 0


def iter_steps(output: Mapping[str, Any]) -> Iterator[SkyrlStep]:
    """The rows of one GeneratorOutput (or of a single-sample row)."""
    single = output["response_ids"] and not isinstance(_tolist(output["response_ids"])[0], list)
    cols = {k: _tolist(output.get(k)) for k in COLUMNS}
    if single:
        cols = {k: (None if v is None else [v]) for k, v in cols.items()}
        if output.get("trajectory_id") is not None:
            cols["trajectory_ids"] = [output["trajectory_id"]]
    n = len(cols["response_ids"])

    def at(name: str, i: int) -> Any:
        col = cols.get(name)
        return None if col is None or i >= len(col) else col[i]

    for i in range(n):
        instance, repetition = _ids_of(at("trajectory_ids", i))
        last = at("is_last_step", i)
        yield SkyrlStep(
            prompt_token_ids=[int(t) for t in cols["prompt_token_ids"][i]],
            response_ids=[int(t) for t in cols["response_ids"][i]],
            loss_mask=at("loss_masks", i),
            logprobs=at("rollout_logprobs", i),
            reward=at("rewards", i),
            stop_reason=at("stop_reasons", i),
            instance_id=instance,
            repetition_id=repetition,
            is_last_step=True if last is None else bool(last),
        )


def group_trajectories(steps: Sequence[SkyrlStep]) -> list[SkyrlTrajectory]:
    """Steps grouped into trajectories; without ids, samples of one prompt form a group."""
    by_key: dict[tuple[str, int], SkyrlTrajectory] = {}
    per_prompt: dict[str, int] = {}
    for step in steps:
        if step.instance_id is None:
            instance = "prompt-" + hashlib.sha1(json.dumps(step.prompt_token_ids).encode()).hexdigest()[:12]
            repetition = per_prompt.get(instance, 0)
            per_prompt[instance] = repetition + 1
            key = (instance, repetition)
        else:
            key = (step.instance_id, step.repetition_id or 0)
        traj = by_key.setdefault(key, SkyrlTrajectory(*key))
        traj.steps.append(step)
    return list(by_key.values())


def split_response(
    response: list[int], mask: list[int] | None, logprobs: list[float] | None
) -> list[tuple[list[int], list[int], list[float]]]:
    """(env tokens before, model tokens, their logprobs) per model turn, split where the loss mask changes."""
    if mask is None:
        return [([], response, list(logprobs) if logprobs is not None else [0.0] * len(response))]
    lps = list(logprobs) if logprobs is not None else [0.0] * len(response)
    turns: list[tuple[list[int], list[int], list[float]]] = []
    env: list[int] = []
    i = 0
    while i < len(response):
        if not mask[i]:
            env.append(response[i])
            i += 1
            continue
        j = i
        while j < len(response) and mask[j]:
            j += 1
        turns.append((env, response[i:j], lps[i:j]))
        env = []
        i = j
    if env:  # environment tokens after the last model turn: keep them on a final empty turn
        turns.append((env, [], []))
    return turns


def record_trajectory(session: ImportSession, traj: SkyrlTrajectory, source: str) -> None:
    """Record one SkyRL trajectory through the session's Recorder."""
    trajectory_id = stable_trajectory_id(
        session.report.run_id, "skyrl", f"{source}:{traj.instance_id}:{traj.repetition_id}"
    )
    if session.already_imported(trajectory_id):
        return
    last = traj.steps[-1]
    rec = session.recorder.start(
        traj.instance_id,
        traj.instance_id,
        traj.repetition_id,
        harness="skyrl",
        trajectory_id=trajectory_id,
        attributes={
            "source": "skyrl",
            "file": source,
            "logprobs_recorded": all(s.logprobs is not None for s in traj.steps),
        },
    )
    if any(s.logprobs is None for s in traj.steps):
        session.report.warnings.append(
            f"{traj.instance_id}_{traj.repetition_id}: no rollout_logprobs; stored with loss_mask 0"
        )
    for step in traj.steps:
        first = True
        for env, out, lps in split_response(step.response_ids, step.loss_mask, step.logprobs):
            mask = [step.logprobs is not None] * len(out)
            if first:
                rec.turn(
                    out,
                    lps,
                    policy_version=0,
                    full_input_token_ids=step.prompt_token_ids + env,
                    loss_mask=mask,
                    finish_reason=step.stop_reason,
                )
                first = False
            else:
                rec.turn(
                    out,
                    lps,
                    policy_version=0,
                    input_token_ids=env,
                    loss_mask=mask,
                    finish_reason=step.stop_reason,
                )
            session.report.turns += 1
    reward = last.reward
    components = None
    if isinstance(reward, list):  # per-token rewards: the trajectory's reward is their sum
        components = {
            "per_token_sum": float(sum(reward)),
            "nonzero_tokens": float(sum(1 for r in reward if r)),
        }
        reward = float(sum(reward))
    if reward is not None:
        rec.reward(float(reward), components=components, verifier="skyrl")
    failure = taxonomy.CONTEXT_EXHAUSTED if last.stop_reason == "length" else taxonomy.COMPLETED
    if not last.is_last_step:
        failure = taxonomy.Failure("error", taxonomy.SYSTEM, taxonomy.HARNESS_BEHAVIOR, reward_valid=False)
    rec.finish(
        failure.status,
        failure_origin=failure.origin,
        failure_label=failure.label,
        message=None if last.is_last_step else "the dump ends before this trajectory's last step",
    )
    session.done_one()


def import_skyrl(
    lake: Lake, paths: Sequence[Path | str], run_id: str, *, progress: Any | None = None
) -> ImportReport:
    """Import SkyRL GeneratorOutput dump files into `lake` under `run_id`."""
    session = ImportSession(lake, run_id, "skyrl")
    for path in map(Path, paths):
        steps = [s for output in load_outputs(path) for s in iter_steps(output)]
        for traj in group_trajectories(steps):
            record_trajectory(session, traj, path.name)
            if progress is not None:
                progress.update(1)
    return session.close()
