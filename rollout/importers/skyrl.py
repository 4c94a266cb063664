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
A row without token ids but with its text (a `responses` column) is stored as a turn with no
tokens, the text in the turn's attributes and `tokens_recorded: false`; it is never
re-tokenised.

`record_skyrl_trajectory` is the one mapping from SkyRL rows to trajlake events; the live
adapter (`rollout/adapters/skyrl.py`) uses it too, adding the engine's own answers per turn.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajlake.ingest.recorder import Recorder
from trajlake.rollout import taxonomy
from trajlake.rollout.errors import ImportFormatError
from trajlake.rollout.importers.base import (
    ImportReport,
    ImportSession,
    RecordedTrajectory,
    stable_trajectory_id,
)
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
    "responses",  # not a GeneratorOutput field: the response text, where a dump or the engine kept it
)
SOURCE = "skyrl"


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
    text: str | None = None


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
        if not isinstance(item, Mapping) or not ({"response_ids", "responses"} & set(item)):
            raise ImportFormatError(
                "not a SkyRL GeneratorOutput (needs response_ids, or the responses' text)", path=str(path)
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
    cols = {k: _tolist(output.get(k)) for k in COLUMNS}
    ids = cols["response_ids"]
    if ids is not None:  # one sample's row holds ints, a batch's holds lists
        single = bool(ids) and not isinstance(ids[0], (list, type(None)))
    else:
        single = isinstance(cols["responses"], str)
    if single:
        cols = {k: (None if v is None else [v]) for k, v in cols.items()}
        if output.get("trajectory_id") is not None:
            cols["trajectory_ids"] = [output["trajectory_id"]]
    n = len(cols["response_ids"] if cols["response_ids"] is not None else cols["responses"] or [])

    def at(name: str, i: int) -> Any:
        col = cols.get(name)
        return None if col is None or i >= len(col) else col[i]

    for i in range(n):
        instance, repetition = _ids_of(at("trajectory_ids", i))
        last = at("is_last_step", i)
        yield SkyrlStep(
            prompt_token_ids=[int(t) for t in at("prompt_token_ids", i) or []],
            response_ids=[int(t) for t in at("response_ids", i) or []],
            loss_mask=at("loss_masks", i),
            logprobs=at("rollout_logprobs", i),
            reward=at("rewards", i),
            stop_reason=at("stop_reasons", i),
            instance_id=instance,
            repetition_id=repetition,
            is_last_step=True if last is None else bool(last),
            text=at("responses", i),
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


@dataclass
class EngineCall:
    """One answer of the inference engine, as it returned it (the live adapter's per-turn detail)."""

    prompt_token_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    stop_reason: str | None
    text: str | None = None
    latency_s: float | None = None
    policy_version: int | None = None


_STOPS: dict[str, taxonomy.Failure] = {
    "length": taxonomy.CONTEXT_EXHAUSTED,  # max tokens or max input length: the model ran out of room
    "abort": taxonomy.INFRA_FAILED,  # the engine aborted the request (a weight sync, a restart)
    "aborted": taxonomy.INFRA_FAILED,
    "error": taxonomy.INFRA_FAILED,
}


def outcome(traj: SkyrlTrajectory) -> tuple[taxonomy.Failure, str | None]:
    """(failure, message) of a SkyRL trajectory from its last row."""
    last = traj.steps[-1]
    if not last.is_last_step:
        return taxonomy.HARNESS_FAILED, "the output ends before this trajectory's last step"
    failure = _STOPS.get(str(last.stop_reason), taxonomy.COMPLETED)
    return failure, None if failure is taxonomy.COMPLETED else f"stop reason {last.stop_reason}"


def _reward(value: float | list[float] | None) -> tuple[float | None, dict[str, float] | None]:
    if isinstance(value, list):  # per-token rewards: the trajectory's reward is their sum
        return float(sum(value)), {
            "per_token_sum": float(sum(value)),
            "nonzero_tokens": float(sum(1 for r in value if r)),
        }
    return (None if value is None else float(value)), None


def _text_turn(
    rec: Any,
    result: RecordedTrajectory,
    label: str,
    text: str | None,
    version: int | None,
    reason: str | None,
) -> None:
    """A turn the engine answered without token ids: its text, flagged, never re-tokenised."""
    result.warnings.append(f"{label}: turn {result.turns} has no token ids; stored as text")
    rec.turn([], [], version, input_token_ids=[], finish_reason=reason,
             attributes={"tokens_recorded": False, "completion": text})  # fmt: skip
    result.turns += 1


def _turns_from_rows(
    rec: Any, traj: SkyrlTrajectory, version: int | None, result: RecordedTrajectory, label: str
) -> None:
    for step in traj.steps:
        if not step.response_ids and step.text is not None:
            _text_turn(rec, result, label, step.text, version, step.stop_reason)
            continue
        first = True
        for env, out, lps in split_response(step.response_ids, step.loss_mask, step.logprobs):
            mask = [step.logprobs is not None] * len(out)
            inputs = (
                {"full_input_token_ids": step.prompt_token_ids + env} if first else {"input_token_ids": env}
            )
            rec.turn(
                out, lps, policy_version=version, loss_mask=mask, finish_reason=step.stop_reason, **inputs
            )
            first = False
            result.turns += 1
            result.tokens += len(out) + len(env)
        result.tokens += len(step.prompt_token_ids)


def _turns_from_calls(
    rec: Any,
    traj: SkyrlTrajectory,
    calls: Sequence[EngineCall],
    version: int | None,
    result: RecordedTrajectory,
    label: str,
) -> None:
    trains = any(any(s.loss_mask or []) for s in traj.steps) or all(s.loss_mask is None for s in traj.steps)
    for call in calls:
        pv = version if call.policy_version is None else call.policy_version
        if not call.response_ids and call.text:
            _text_turn(rec, result, label, call.text, pv, call.stop_reason)
            continue
        logprobs, mask = call.logprobs, [trains] * len(call.response_ids)
        if logprobs is None or len(logprobs) != len(call.response_ids):
            logprobs, mask = [0.0] * len(call.response_ids), [False] * len(call.response_ids)
        before = len(rec.context)
        drift = rec.turn(call.response_ids, logprobs, pv, full_input_token_ids=call.prompt_token_ids,
                         loss_mask=mask, finish_reason=call.stop_reason, latency_s=call.latency_s)  # fmt: skip
        result.turns += 1
        result.tokens += len(call.prompt_token_ids) - (0 if drift else before) + len(call.response_ids)


def record_skyrl_trajectory(
    recorder: Recorder,
    traj: SkyrlTrajectory,
    trajectory_id: str,
    *,
    policy_version: int | None = None,
    group_id: str | None = None,
    calls: Sequence[EngineCall] | None = None,
    attributes: Mapping[str, Any] | None = None,
    tags: Sequence[str] = (),
    failure: tuple[taxonomy.Failure, str] | None = None,
) -> RecordedTrajectory:
    """Record one SkyRL trajectory (its GeneratorOutput rows) as one finished trajectory.

    Turns come from the engine's answers (`calls`, each turn's input exactly as the engine saw
    it, so the Recorder flags TITO drift) when the live adapter captured them, else from the
    rows (model runs split at loss-mask changes). `group_id` (the prompt group) defaults to the
    instance id. `failure` overrides the rows' outcome (a generator that raised).
    """
    result = RecordedTrajectory(trajectory_id)
    label = f"{traj.instance_id}_{traj.repetition_id}"
    if calls:
        has_logprobs = all(c.logprobs is not None for c in calls)
    else:
        has_logprobs = all(s.logprobs is not None for s in traj.steps)
    rec = recorder.start(
        traj.instance_id,
        group_id or traj.instance_id,
        traj.repetition_id,
        harness=SOURCE,
        trajectory_id=trajectory_id,
        tags=list(tags),
        attributes={"source": SOURCE, "logprobs_recorded": has_logprobs, **(attributes or {})},
    )
    if not has_logprobs:
        result.warnings.append(f"{label}: no rollout_logprobs; stored with loss_mask 0")
    if calls:
        _turns_from_calls(rec, traj, calls, policy_version, result, label)
    else:
        _turns_from_rows(rec, traj, policy_version, result, label)
    found, message = failure or outcome(traj)
    reward, components = _reward(traj.steps[-1].reward if traj.steps else None)
    if found.reward_valid and reward is not None:
        rec.reward(reward, components=components, verifier=SOURCE)
    elif not found.reward_valid:
        rec.reward(None, verifier=SOURCE, verifier_error=(message or "no valid reward")[:500])
    rec.finish(found.status, failure_origin=found.origin, failure_label=found.label, message=message)
    return result


def record_trajectory(session: ImportSession, traj: SkyrlTrajectory, source: str) -> None:
    """Record one SkyRL trajectory of a dump file through the session's Recorder."""
    trajectory_id = stable_trajectory_id(
        session.report.run_id, SOURCE, f"{source}:{traj.instance_id}:{traj.repetition_id}"
    )
    with session.recording():
        if session.already_imported(trajectory_id):
            return
        done = record_skyrl_trajectory(session.recorder, traj, trajectory_id, attributes={"file": source},
                                       policy_version=session.policy_version)  # fmt: skip
        session.report.turns += done.turns
        session.report.warnings.extend(done.warnings)
        session.done_one()


def import_skyrl(
    lake: Lake,
    paths: Sequence[Path | str],
    run_id: str,
    *,
    progress: Any | None = None,
    policy_version: int | None = None,
) -> ImportReport:
    """Import SkyRL GeneratorOutput dump files into `lake` under `run_id`; `policy_version`: the
    version that generated them (a dump records none), unknown when None."""
    session = ImportSession(lake, run_id, "skyrl", policy_version=policy_version)
    for path in map(Path, paths):
        steps = [s for output in load_outputs(path) for s in iter_steps(output)]
        for traj in group_trajectories(steps):
            record_trajectory(session, traj, path.name)
            if progress is not None:
                progress.update(1)
    return session.close()
