"""Import Harbor job directories: one trajectory per trial, token ids exactly as recorded.

A Harbor job directory holds one directory per trial, each with `result.json` (a
`TrialResult`: `verifier_result.rewards`, `exception_info`, `agent_result.rollout_details`,
timings) and usually `agent/trajectory.json` (ATIF v1.x: `steps` with `tool_calls`,
`observation` and per-step `metrics` carrying `prompt_token_ids`, `completion_token_ids`,
`logprobs`). Tokens come from `rollout_details` (the main agent's segment, the first one),
else from the ATIF step metrics; tool calls come from the ATIF steps. Nothing is re-tokenised:
a trial without token ids is imported with its outcome and no turns.

The reward comes from the verifier, and the outcome from `exception_info` through the
failure taxonomy: no verifier result at all is a system `verifier_error` with no reward, a
context-length error is a model-side `context_exhausted`, a rate limit is system `infra`.
What a verifier needs to judge the trial again is kept too: the agent's last message as
`final_answer`, and the trial directory's files as the `artifacts` manifest (small ones copied
into the lake), so `trajlake rescore` works after the job directory is gone.
"""

from __future__ import annotations

import json
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
from trajlake.store.artifacts import manifest
from trajlake.store.lake import Lake

CODE_EXECUTION_TOOLS = frozenset(
    {
        "bash",
        "shell",
        "execute_bash",
        "execute_command",
        "run_command",
        "terminal",
        "tmux",
        "python",
        "ipython",
        "execute_python",
        "run_python",
        "code_interpreter",
        "exec",
    }
)


@dataclass
class HarborTurn:
    """One LLM call: the full prompt it saw (when recorded), what it sampled, and the logprobs."""

    prompt_token_ids: list[int] | None
    completion_token_ids: list[int]
    logprobs: list[float] | None
    text: str | None = None  # the reply, kept when the step has no token ids (never re-tokenised)

    @property
    def has_tokens(self) -> bool:
        return bool(self.completion_token_ids)


@dataclass
class HarborToolCall:
    """A tool call from an ATIF step and its observation."""

    call_id: str
    name: str
    arguments: Any
    after_turn: int  # index of the turn that made the call (-1: before any turn)
    has_result: bool = True


@dataclass
class HarborTrial:
    """The parts of one trial directory the lake keeps."""

    path: Path
    trial_name: str
    task_name: str
    agent: str | None = None
    model: str | None = None
    rewards: dict[str, float] | None = None
    has_verifier_result: bool = False
    exception_type: str | None = None
    exception_message: str | None = None
    turns: list[HarborTurn] = field(default_factory=list)
    tool_calls: list[HarborToolCall] = field(default_factory=list)
    token_source: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    final_answer: str | None = None
    """The agent's last message (ATIF), what a re-score judges again."""

    @classmethod
    def from_dir(cls, path: Path) -> HarborTrial:
        """Read a trial directory: `result.json` and, if present, `agent/trajectory.json`."""
        return cls.from_result(_load_json(path / "result.json"), path)

    @classmethod
    def from_result(cls, result: Any, path: Path | None) -> HarborTrial:
        """Map a `TrialResult` (as JSON data) and, when `path` has one, its `agent/trajectory.json`.

        The importer passes what `result.json` holds; the live hook passes the result Harbor
        hands to `on_trial_ended`, dumped, and the trial directory it is about to finalise.
        """
        where = str((path or Path(".")) / "result.json")
        if not isinstance(result, Mapping) or ("trial_name" not in result and "task_name" not in result):
            raise ImportFormatError("not a Harbor TrialResult (no trial_name/task_name)", path=where)
        name = (path or Path(str(result.get("trial_name") or "trial"))).name
        agent_info = result.get("agent_info") or {}
        model_info = agent_info.get("model_info") or {}
        verifier = result.get("verifier_result")
        exc = result.get("exception_info") or {}
        trial = cls(
            path=path or Path(name),
            trial_name=str(result.get("trial_name") or name),
            task_name=str(result.get("task_name") or name.split("__")[0]),
            agent=agent_info.get("name"),
            model=model_info.get("name"),
            rewards=(verifier or {}).get("rewards"),
            has_verifier_result=verifier is not None,
            exception_type=exc.get("exception_type"),
            exception_message=exc.get("exception_message"),
        )
        trial.attributes = {
            "source": "harbor",
            "trial_name": trial.trial_name,
            "trial_id": str(result.get("id") or ""),
            "started_at": result.get("started_at"),
            "finished_at": result.get("finished_at"),
            "agent_execution": result.get("agent_execution"),
            "verifier": result.get("verifier"),
        }
        details = ((result.get("agent_result") or {}).get("rollout_details")) or []
        if details:
            trial.turns = _turns_from_rollout_detail(details[0])
            trial.token_source = "rollout_details"
        atif_path = path / "agent" / "trajectory.json" if path is not None else None
        if atif_path is not None and atif_path.exists():
            steps = _load_json(atif_path).get("steps") or []
            atif_turns, trial.tool_calls = _from_atif_steps(steps)
            trial.final_answer = _final_answer(steps)
            if not trial.turns and atif_turns:
                trial.turns = atif_turns
                trial.token_source = "atif" if any(t.has_tokens for t in atif_turns) else None
        return trial

    def outcome(self) -> tuple[taxonomy.Failure, float | None, str | None]:
        """(failure, reward or None, verifier error) per the taxonomy."""
        reward = _main_reward(self.rewards)
        if self.exception_type:
            failure = taxonomy.classify_exception_name(self.exception_type, self.exception_message)
            if not failure.reward_valid:
                return failure, None, f"{self.exception_type}: {self.exception_message or ''}"[:500]
            return failure, reward, None
        if reward is None:
            why = "the verifier produced no rewards" if self.has_verifier_result else "no verifier result"
            return taxonomy.VERIFIER_FAILED, None, why
        return taxonomy.COMPLETED, reward, None


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ImportFormatError(f"cannot read JSON ({err})", path=str(path)) from err


def _main_reward(rewards: Mapping[str, Any] | None) -> float | None:
    if not rewards:
        return None
    if "reward" in rewards:
        return float(rewards["reward"])
    if len(rewards) == 1:
        return float(next(iter(rewards.values())))
    return float(sum(float(v) for v in rewards.values()) / len(rewards))


def _final_answer(steps: Sequence[Mapping[str, Any]]) -> str | None:
    """The message of the last agent step, as text (None without one)."""
    messages = [
        s.get("message") for s in steps if s.get("source") == "agent" and s.get("message") is not None
    ]
    if not messages:
        return None
    return messages[-1] if isinstance(messages[-1], str) else json.dumps(messages[-1])


def _turns_from_rollout_detail(detail: Mapping[str, Any]) -> list[HarborTurn]:
    completions = detail.get("completion_token_ids") or []
    prompts = detail.get("prompt_token_ids") or []
    logprobs = detail.get("logprobs") or []
    return [
        HarborTurn(
            prompts[i] if i < len(prompts) else None,
            list(completion),
            logprobs[i] if i < len(logprobs) else None,
        )
        for i, completion in enumerate(completions)
    ]


def _from_atif_steps(steps: Sequence[Mapping[str, Any]]) -> tuple[list[HarborTurn], list[HarborToolCall]]:
    turns: list[HarborTurn] = []
    calls: list[HarborToolCall] = []
    agent_steps = -1
    for step in steps:
        if step.get("source") != "agent":
            continue
        agent_steps += 1
        metrics = step.get("metrics") or {}
        if metrics.get("completion_token_ids") is not None:
            turns.append(
                HarborTurn(
                    metrics.get("prompt_token_ids"),
                    list(metrics["completion_token_ids"]),
                    metrics.get("logprobs"),
                )
            )
        else:  # an agent without rollout details: the reply's text, flagged, never re-tokenised
            message = step.get("message")
            turns.append(
                HarborTurn(None, [], None, text=message if isinstance(message, str) else json.dumps(message))
            )
        answered = {r.get("source_call_id") for r in ((step.get("observation") or {}).get("results") or [])}
        for call in step.get("tool_calls") or []:
            call_id = str(call.get("tool_call_id") or f"step{step.get('step_id')}-{len(calls)}")
            calls.append(
                HarborToolCall(
                    call_id,
                    str(call.get("function_name") or "unknown"),
                    call.get("arguments"),
                    after_turn=agent_steps,
                    has_result=call_id in answered or not answered,
                )
            )
    return turns, calls


def find_trials(job_dir: Path) -> list[Path]:
    """Trial directories under `job_dir` (or `job_dir` itself when it is one), sorted by name."""
    job_dir = Path(job_dir)
    if not job_dir.is_dir():
        raise ImportFormatError(
            "not a directory; pass a Harbor job directory (jobs/<job-name>)", path=str(job_dir)
        )
    if (job_dir / "agent").is_dir() and (job_dir / "result.json").exists():
        return [job_dir]
    return sorted(p.parent for p in job_dir.glob("*/result.json"))


def trajectory_id_of(run_id: str, trial_name: str) -> str:
    """The trajectory id of a Harbor trial in `run_id` (the same live and imported)."""
    return stable_trajectory_id(run_id, "harbor", trial_name)


def record_trial(
    recorder: Recorder,
    trial: HarborTrial,
    sample_index: int,
    *,
    trajectory_id: str | None = None,
    retried: str | None = None,
    policy_version: int | None = None,
    artifacts: list[dict[str, Any]] | None = None,
) -> RecordedTrajectory:
    """Record one trial as one finished trajectory through `recorder`.

    `retried`: Harbor abandoned this attempt and runs the trial again (why); it ends as a system
    failure tagged `retried`, so no reward from it is trained on. `policy_version`: the weight
    version served, None (stored as unknown) when not known. `artifacts`: the manifest of the trial
    directory's files (`store.artifacts.manifest`), for a re-score.
    """
    result = RecordedTrajectory(trajectory_id or trajectory_id_of(recorder.run_id, trial.trial_name))
    failure, reward, verifier_error = trial.outcome()
    attributes = dict(trial.attributes, token_source=trial.token_source, exception_type=trial.exception_type,
                      retried=retried, tokens_recorded=any(t.has_tokens for t in trial.turns))  # fmt: skip
    traj = recorder.start(
        trial.task_name,
        trial.task_name,
        sample_index,
        environment=trial.task_name,
        harness=trial.agent,
        model=trial.model,
        tags=["retried"] if retried else None,
        trajectory_id=result.trajectory_id,
        attributes=attributes,
    )
    calls_after: dict[int, list[HarborToolCall]] = {}
    for call in trial.tool_calls:
        calls_after.setdefault(call.after_turn if trial.turns else -1, []).append(call)
    _record_calls(traj, calls_after.pop(-1, []))
    if not any(t.has_tokens for t in trial.turns):
        result.warnings.append(
            f"{trial.trial_name}: no token ids (no rollout_details, no ATIF step metrics); stored with its "
            "outcome and any reply text, tokens_recorded false"
        )
    for i, turn in enumerate(trial.turns):
        if not turn.has_tokens:
            traj.turn([], [], policy_version, input_token_ids=[],
                      attributes={"tokens_recorded": False, "completion": turn.text})  # fmt: skip
            result.turns += 1
            _record_calls(traj, calls_after.pop(i, []))
            continue
        logprobs = turn.logprobs
        mask = None
        if logprobs is None:  # not recorded: the tokens are kept, but no loss may be taken on them
            logprobs, mask = [0.0] * len(turn.completion_token_ids), [False] * len(turn.completion_token_ids)
            result.warnings.append(f"{trial.trial_name}: turn {i} has no logprobs; stored with loss_mask 0")
        if turn.prompt_token_ids is not None:
            traj.turn(turn.completion_token_ids, logprobs, policy_version=policy_version,
                      full_input_token_ids=turn.prompt_token_ids, loss_mask=mask)  # fmt: skip
        else:
            traj.turn(turn.completion_token_ids, logprobs, policy_version=policy_version, input_token_ids=[],
                      loss_mask=mask)  # fmt: skip
        result.turns += 1
        result.tokens += len(turn.completion_token_ids)
        _record_calls(traj, calls_after.pop(i, []))
    for rest in calls_after.values():
        _record_calls(traj, rest)
    result.tool_calls = len(trial.tool_calls)
    message = f"{trial.exception_type}: {trial.exception_message}" if trial.exception_type else verifier_error
    if retried:
        failure = failure if failure.origin == taxonomy.SYSTEM else taxonomy.HARNESS_FAILED
        reward, verifier_error = None, f"abandoned by a Harbor retry ({retried})"
        message = f"abandoned by a Harbor retry ({retried}); {message or 'no error recorded'}"
    if reward is not None or verifier_error is not None or trial.rewards:
        traj.reward(reward, components=trial.rewards, verifier="harbor", verifier_error=verifier_error)
    traj.finish(
        failure.status,
        failure_origin=failure.origin,
        failure_label=failure.label,
        message=(message or None) and message[:2000],
        final_answer=trial.final_answer,
        artifacts=artifacts or None,
    )
    return result


def _record_calls(traj: Any, calls: list[HarborToolCall]) -> None:
    for call in calls:
        is_code = call.name.lower() in CODE_EXECUTION_TOOLS
        call_id = traj.tool_call(
            call.name,
            call.arguments if isinstance(call.arguments, (str, Mapping)) else json.dumps(call.arguments),
            call_id=call.call_id,
            is_code_execution=is_code,
        )
        traj.tool_result(
            call_id,
            call.name,
            ok=call.has_result,
            error_type=None if call.has_result else "tool_error",
            is_code_execution=is_code,
        )


def iter_trials(job_dir: Path, report: ImportReport) -> Iterator[tuple[HarborTrial, int]]:
    """Each readable trial with its sample index among the trials of its task; unreadable ones are reported."""
    seen: dict[str, int] = {}
    for path in find_trials(job_dir):
        try:
            trial = HarborTrial.from_dir(path)
        except ImportFormatError as err:
            report.warnings.append(str(err))
            continue
        index = seen.get(trial.task_name, 0)
        seen[trial.task_name] = index + 1
        yield trial, index


def import_harbor(
    lake: Lake,
    job_dir: Path | str,
    run_id: str,
    *,
    progress: Any | None = None,
    policy_version: int | None = None,
) -> ImportReport:
    """Import every trial of a Harbor job directory into `lake` under `run_id`; `policy_version`:
    the version that generated the turns (Harbor records none), unknown when None."""
    session = ImportSession(lake, run_id, "harbor", policy_version=policy_version)
    trials = find_trials(Path(job_dir))
    if not trials:
        raise ImportFormatError("no trial directories (*/result.json) found", path=str(job_dir))
    for trial, index in iter_trials(Path(job_dir), session.report):
        trajectory_id = trajectory_id_of(run_id, trial.trial_name)
        with session.recording():
            if not session.already_imported(trajectory_id):
                artifacts = manifest(lake, trial.path) if trial.path.is_dir() else None
                rec = record_trial(session.recorder, trial, index, trajectory_id=trajectory_id,
                                   policy_version=policy_version, artifacts=artifacts)  # fmt: skip
                session.report.turns += rec.turns
                session.report.tool_calls += rec.tool_calls
                session.report.warnings.extend(rec.warnings)
                session.done_one(trajectory_id)
        if progress is not None:
            progress.update(1)
    return session.close()
