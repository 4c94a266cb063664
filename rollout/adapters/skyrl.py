"""SkyRL 0.4 and the lake, both ways: a generator that records every rollout live, and one that
serves a SkyRL trainer staleness-filtered batches from the lake.

Where a run is, in the lines a user adds (skyrl is imported only inside this module's functions,
so trajlake installs and imports without it):

    class MyExp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            inner = super().get_generator(cfg, tokenizer, inference_engine_client)
            return RecordingGenerator(inner, recorder)          # rollouts -> the lake
            # or: LakeGenerator(Sampler(lake, catalog, SamplerConfig(...)))   # the lake -> the trainer

Every `GeneratorOutput` passes `GeneratorInterface.generate`; `RecordingGenerator` wraps it and
records each trajectory (one row, or the rows of one trajectory id in step-wise training) with
the shared mapping of the GeneratorOutput importer (`rollout/importers/skyrl.py`). Around a
`SkyRLGymGenerator` it also keeps each engine answer of `agent_loop` (through a thin wrapper of
the generator's inference client): the turns are then the engine's answers, token ids and
logprobs exactly as the engine returned them and each turn's input exactly as the engine saw it,
so the Recorder flags TITO drift wherever SkyRL re-tokenised (a custom chat template, a
`postprocessed_action`, step-wise re-templating). Each turn's policy version is the client's
`weight_version` (its count of weight syncs); without one, the batch's `global_step - 1`.

Each trajectory is ended exactly once: a `generate` that raises ends every trajectory of its
batch as a failure (the exception through the failure taxonomy, with the turns the engine had
answered), and a retry of the same batch records new trajectories (the attempt is part of the id).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trajlake.ingest.recorder import Recorder
from trajlake.rollout import taxonomy
from trajlake.rollout.adapters import check_release, installed_release, supported_releases
from trajlake.rollout.errors import RolloutError
from trajlake.rollout.importers.base import RecordedTrajectory, stable_trajectory_id
from trajlake.rollout.importers.skyrl import (
    SOURCE,
    EngineCall,
    SkyrlTrajectory,
    group_trajectories,
    iter_steps,
    record_skyrl_trajectory,
)

SUPPORTED_VERSIONS = ("0.4",)  # skyrl release lines (major.minor) whose GeneratorOutput this maps


class UnsupportedSkyrl(RolloutError):
    """The skyrl release is not one this adapter maps."""


class LakeBatchError(RolloutError):
    """The lake could not serve the batch a SkyRL trainer asked for."""


def supported() -> str:
    return supported_releases("skyrl", SUPPORTED_VERSIONS)


def check_version(version: str | None) -> None:
    """Raise `UnsupportedSkyrl` unless `version` is a skyrl release this adapter maps."""
    check_release("skyrl", version, SUPPORTED_VERSIONS, UnsupportedSkyrl)


def installed_version() -> str:
    """The installed skyrl release; raise `UnsupportedSkyrl` unless it is supported."""
    return installed_release("skyrl", SUPPORTED_VERSIONS, UnsupportedSkyrl, "skyrl")


def _register(cls: type) -> None:
    """Make `cls` a virtual `GeneratorInterface`, so SkyRL's isinstance checks accept it."""
    from skyrl.train.generators.base import GeneratorInterface

    GeneratorInterface.register(cls)


# -- per-turn capture ----------------------------------------------------------------------------
@dataclass
class _Batch:
    """What one `generate` call's agent loops answered, by the row index of the input batch."""

    calls: dict[int, list[EngineCall]] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    started: int = 0


_BATCH: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar("trajlake_skyrl_batch", default=None)
_CALLS: contextvars.ContextVar[list[EngineCall] | None] = contextvars.ContextVar(
    "trajlake_skyrl_calls", default=None
)


class CapturingClient:
    """A SkyRL inference client that keeps each `generate` answer for the adapter; all else is the client's."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_client":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._client, name)

    async def generate(self, input_batch: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        out = await self._client.generate(input_batch, *args, **kwargs)
        calls, batch = _CALLS.get(), _BATCH.get()
        if calls is None and batch is None:
            return out
        latency = time.monotonic() - start
        version = getattr(self._client, "weight_version", None)
        logprobs = out.get("response_logprobs")
        texts = out.get("responses") or []
        for j, prompt in enumerate(input_batch.get("prompt_token_ids") or []):
            call = EngineCall(
                prompt_token_ids=[int(t) for t in prompt],
                # copies: agent_loop appends an EOS to the engine's list in place
                response_ids=[int(t) for t in out["response_ids"][j]],
                logprobs=None if logprobs is None or logprobs[j] is None else [float(x) for x in logprobs[j]],
                stop_reason=out["stop_reasons"][j],
                text=texts[j] if j < len(texts) else None,
                latency_s=latency,
                policy_version=version if isinstance(version, int) else None,
            )
            # inside agent_loop: this trajectory's list; batched generation: row j of the batch
            (calls if calls is not None else batch.calls.setdefault(j, [])).append(call)  # type: ignore[union-attr]
        return out


def _capture_agent_loop(generator: Any) -> None:
    """Wrap the generator's `agent_loop` and client so each trajectory's engine answers are kept."""
    generator.inference_engine_client = CapturingClient(generator.inference_engine_client)
    original = generator.agent_loop

    async def run(batch: _Batch | None, index: int | None, args: tuple, kwargs: dict) -> Any:
        calls: list[EngineCall] = []
        if batch is not None and index is not None:
            batch.calls[index] = calls
        token = _CALLS.set(calls)
        try:
            return await original(*args, **kwargs)
        except BaseException as err:
            if batch is not None and index is not None:
                batch.errors[index] = err
            raise
        finally:
            _CALLS.reset(token)

    def agent_loop(*args: Any, **kwargs: Any) -> Any:
        # called in row order when `generate` builds its tasks: the index is the input row
        batch = _BATCH.get()
        index = None
        if batch is not None:
            index, batch.started = batch.started, batch.started + 1
        return run(batch, index, args, kwargs)

    generator.agent_loop = agent_loop


def _ids_of(tid: Any) -> tuple[str, int]:
    if isinstance(tid, Mapping):
        return str(tid["instance_id"]), int(tid.get("repetition_id", 0))
    return str(tid.instance_id), int(tid.repetition_id)


# -- rollouts into the lake ----------------------------------------------------------------------
class RecordingGenerator:
    """A SkyRL `GeneratorInterface` that records every trajectory its inner generator produces.

    `policy_version`: the weight version served (an int, or a callable read per batch); by default
    the inference client's `weight_version` per turn, else the batch's `global_step - 1`.
    `capture_turns`: keep each engine answer of `agent_loop` (a `SkyRLGymGenerator`'s).
    """

    def __init__(
        self,
        generator: Any,
        recorder: Recorder,
        *,
        policy_version: int | Callable[[], int] | None = None,
        capture_turns: bool = True,
    ) -> None:
        self.version = installed_version()
        _register(type(self))
        self.inner = generator
        self.recorder = recorder
        self.policy_version = policy_version
        self.session = uuid.uuid4().hex[:12]  # a new process's rollouts are new trajectories
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.trajectories = self.turns = self.tokens = 0
        self.warnings: list[str] = []
        if (
            capture_turns
            and hasattr(generator, "agent_loop")
            and hasattr(generator, "inference_engine_client")
        ):
            _capture_agent_loop(generator)

    def __getattr__(self, name: str) -> Any:
        """Everything else is the inner generator's (its config, tokenizer, agent_loop ...)."""
        if name.startswith("__") or name == "inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def generate(self, input_batch: Mapping[str, Any], disable_tqdm: bool | None = None) -> Any:
        """The inner generator's `generate`, each trajectory recorded once it returns (or raises)."""
        extra = {}
        if disable_tqdm is not None and "disable_tqdm" in inspect.signature(self.inner.generate).parameters:
            extra["disable_tqdm"] = disable_tqdm
        batch = _Batch()
        token = _BATCH.set(batch)
        try:
            output = await self.inner.generate(input_batch, **extra)
        except BaseException as err:
            self.record_failure(input_batch, err, batch)
            raise
        finally:
            _BATCH.reset(token)
        self.record(input_batch, output, batch)
        return output

    # -- recording ------------------------------------------------------------------------
    def _version(self, step: int | None) -> int:
        if self.policy_version is not None:
            return int(self.policy_version() if callable(self.policy_version) else self.policy_version)
        served = getattr(getattr(self.inner, "inference_engine_client", None), "weight_version", None)
        if isinstance(served, int):
            return served
        return max((step or 1) - 1, 0)

    def _record_one(
        self,
        traj: SkyrlTrajectory,
        meta: Any,
        calls: list[EngineCall] | None,
        failure: tuple[taxonomy.Failure, str] | None = None,
    ) -> RecordedTrajectory:
        """Record one trajectory of a batch (`meta`: its `BatchMetadata`) under a fresh attempt id."""
        step = getattr(meta, "global_step", None)
        phase = str(getattr(meta, "training_phase", "train"))
        key = f"{phase}:{step}:{traj.instance_id}:{traj.repetition_id}"
        with self._lock:
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1
        trajectory_id = stable_trajectory_id(self.recorder.run_id, SOURCE, f"{self.session}:{key}:{attempt}")
        rec = record_skyrl_trajectory(
            self.recorder,
            traj,
            trajectory_id,
            policy_version=self._version(step),
            group_id=f"{phase}:{step}:{traj.instance_id}",  # a GRPO group: one prompt at one step
            calls=calls,
            attributes={"global_step": step, "training_phase": phase, "attempt": attempt,
                        "skyrl_version": self.version, "engine_turns": bool(calls)},
            tags=[phase, "failed"] if failure else [phase],
            failure=failure,
        )  # fmt: skip
        with self._lock:
            self.trajectories += 1
            self.turns += rec.turns
            self.tokens += rec.tokens
            self.warnings.extend(rec.warnings)
        return rec

    def record(
        self, input_batch: Mapping[str, Any], output: Mapping[str, Any], batch: _Batch | None = None
    ) -> list[RecordedTrajectory]:
        """Record the trajectories of one `GeneratorOutput` produced for `input_batch`."""
        steps = list(iter_steps(output))
        input_ids = list(input_batch.get("trajectory_ids") or [])
        if output.get("trajectory_ids") is None and len(input_ids) == len(steps):
            # SkyRLGymGenerator leaves them out unless step-wise: the input's, row for row
            for s, tid in zip(steps, input_ids, strict=True):
                s.instance_id, s.repetition_id = _ids_of(tid)
        rows = {_ids_of(t): i for i, t in enumerate(input_ids)}
        done = []
        for position, traj in enumerate(group_trajectories(steps)):
            # the input row that ran this trajectory's agent loop (its engine answers)
            index = rows.get((traj.instance_id, traj.repetition_id), None if rows else position)
            calls = batch.calls.get(index) if batch is not None and index is not None else None
            done.append(self._record_one(traj, input_batch.get("batch_metadata"), calls))
        return done

    def record_failure(
        self, input_batch: Mapping[str, Any], err: BaseException, batch: _Batch | None = None
    ) -> list[RecordedTrajectory]:
        """End every trajectory of a batch whose `generate` raised, with the turns the engine had answered."""
        input_ids = list(input_batch.get("trajectory_ids") or [])
        done = []
        for i in range(len(input_batch.get("prompts") or [])):
            instance, repetition = _ids_of(input_ids[i]) if i < len(input_ids) else (f"row-{i}", 0)
            own = batch.errors.get(i) if batch is not None else None
            cause = own or err
            where = "this trajectory's agent loop" if own is not None else "the batch's generate"
            failure = (
                taxonomy.classify_exception(cause),
                f"{where} raised {type(cause).__name__}: {cause}"[:2000],
            )
            calls = batch.calls.get(i) if batch is not None else None
            done.append(self._record_one(SkyrlTrajectory(instance, repetition), input_batch.get("batch_metadata"),
                                         calls, failure))  # fmt: skip
        return done


# -- the lake into a SkyRL trainer ---------------------------------------------------------------
@runtime_checkable
class BatchSource(Protocol):
    """What LakeGenerator needs of trajlake's `trainer.sampler.Sampler` (rollout does not import
    the trainer package; the Sampler fits this as it is)."""

    lake: Any
    config: Any

    def next_batch(self, trainer_version: int, step: int, timeout_s: float = 0.0) -> Any: ...

    def release(self, batch: Any) -> int: ...

    def commit(self, batch: Any) -> list[str]: ...


def _prompt_lengths(sampler: BatchSource, trajectory_ids: Sequence[str]) -> dict[str, int]:
    """Each trajectory's prompt length: the input of its first turn (or of its last full-input turn)."""
    from trajlake.store.sql import placeholders

    table = sampler.lake.sql(
        "select trajectory_id, seq, len(input_token_ids) as n, coalesce(input_is_full, false) as full "
        f"from events where event_type = 'turn' and run_id = ? and trajectory_id in ({placeholders(len(trajectory_ids))}) "
        "order by trajectory_id, seq",
        [sampler.config.run_id, *trajectory_ids],
    ).to_pylist()
    lengths: dict[str, int] = {}
    for row in table:
        if row["trajectory_id"] not in lengths or row["full"]:
            lengths[row["trajectory_id"]] = int(row["n"] or 0)
    return lengths


class LakeGenerator:
    """A SkyRL `GeneratorInterface` that hands the trainer staleness-filtered batches from the lake.

    The trainer's prompts are not generated: the rows come from trajlake's `Sampler` (finished,
    rewarded, not system failures, staleness <= max_staleness, whole prompt groups, leased). A
    batch is committed (`batch_consumption`) when the trainer asks for the next one, or on
    `close()`. `trainer_version`: an int or callable; by default the batch's `global_step - 1`.
    """

    def __init__(
        self,
        sampler: BatchSource,
        *,
        trainer_version: int | Callable[[], int] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.version = installed_version()
        _register(type(self))
        self.sampler = sampler
        self.trainer_version = trainer_version
        self.timeout_s = timeout_s
        self.pending: Any = None  # the trainer.batch.Batch handed out last
        self.steps = 0

    async def generate(
        self, input_batch: Mapping[str, Any], disable_tqdm: bool | None = None
    ) -> dict[str, Any]:
        """A `GeneratorOutput` of len(prompts) rows from the lake, laid out as the trainer's prompt groups."""
        meta = input_batch.get("batch_metadata")
        step = getattr(meta, "global_step", None) or self.steps + 1
        if self.trainer_version is not None:
            version = int(self.trainer_version() if callable(self.trainer_version) else self.trainer_version)
        else:
            version = max(step - 1, 0)
        self.commit()
        batch = await asyncio.to_thread(self.sampler.next_batch, version, step, self.timeout_s)
        if batch is None:
            raise LakeBatchError(
                f"no batch of run {self.sampler.config.run_id!r} was ready in the lake at trainer version {version} "
                f"within {self.timeout_s} s; are rollouts being recorded, and is max_staleness "
                f"({self.sampler.config.max_staleness}) wide enough?"
            )
        try:
            output = self.to_generator_output(batch, input_batch)
        except LakeBatchError:
            self.sampler.release(batch)
            raise
        self.pending = batch
        self.steps = step
        return output

    def to_generator_output(self, batch: Any, input_batch: Mapping[str, Any]) -> dict[str, Any]:
        """`batch` as a `GeneratorOutput` whose groups line up with the input's prompt groups."""
        from skyrl.train.generators.base import TrajectoryID

        wanted = [_ids_of(t)[0] for t in input_batch.get("trajectory_ids") or []] or [
            str(i) for i in range(len(input_batch["prompts"]))
        ]
        want_sizes = [len(g) for g in _runs(wanted)]
        got_sizes = [len(g) for g in _runs([s.group_id for s in batch.samples])]
        if want_sizes != got_sizes:
            raise LakeBatchError(
                f"the lake's batch has groups of {got_sizes} trajectories for the trainer's prompt groups of "
                f"{want_sizes}; set the sampler's groups_per_batch to train_batch_size and group_size to "
                "n_samples_per_prompt"
            )
        lengths = _prompt_lengths(self.sampler, [s.trajectory_id for s in batch.samples])
        out: dict[str, Any] = {k: [] for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks",
                                                "stop_reasons", "rollout_logprobs", "trajectory_ids")}  # fmt: skip
        repetition: dict[str, int] = {}
        for s in batch.samples:
            p = lengths.get(s.trajectory_id, 0)
            out["prompt_token_ids"].append(s.token_ids[:p].tolist())
            out["response_ids"].append(s.token_ids[p:].tolist())
            out["loss_masks"].append(s.loss_mask[p:].astype(int).tolist())
            out["rollout_logprobs"].append(s.logprobs[p:].astype(float).tolist())
            out["rewards"].append(float(s.reward))
            out["stop_reasons"].append("length" if s.overlong else "stop")
            k = repetition.get(s.group_id, 0)
            repetition[s.group_id] = k + 1
            out["trajectory_ids"].append(TrajectoryID(instance_id=s.group_id, repetition_id=k))
        staleness = [s.staleness for s in batch.samples]
        out["rollout_metrics"] = {
            "trajlake/staleness_mean": sum(staleness) / len(staleness),
            "trajlake/staleness_max": max(staleness),
            **{f"trajlake/sampler_{k}": v for k, v in batch.stats.as_dict().items()},
        }
        out.update(trajectory_generation_times=None, trajectory_time_splits=None, rollout_expert_indices=None,
                   rollout_sample_support=None, is_last_step=None, env_metrics=None)  # fmt: skip
        return out

    def commit(self) -> list[str]:
        """Mark the last handed-out batch consumed (the trainer stepped on it); return its trajectory ids."""
        batch, self.pending = self.pending, None
        return self.sampler.commit(batch) if batch is not None else []

    def close(self) -> None:
        """Commit what the trainer was last given."""
        self.commit()


def _runs(keys: Sequence[str]) -> list[list[str]]:
    """Consecutive equal keys, as lists."""
    runs: list[list[str]] = []
    for key in keys:
        if runs and runs[-1][0] == key:
            runs[-1].append(key)
        else:
            runs.append([key])
    return runs
