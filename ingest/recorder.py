"""The Recorder SDK: the API a harness calls to record a rollout, event by event.

    recorder = Recorder(bus, run_id="run-1", vocab_size=32000)
    with recorder.start(task_id="t1", group_id="g1", sample_index=0, context_budget_tokens=8192) as traj:
        traj.turn(full_input_token_ids=prompt, output_token_ids=out, output_logprobs=lps, policy_version=3)
        call = traj.tool_call("python", {"code": "1+1"}, is_code_execution=True)
        traj.tool_result(call, "python", ok=True, output_tokens=12)
        traj.turn(full_input_token_ids=prompt + out + tool_ids, output_token_ids=..., ...)
        traj.reward(1.0, verifier="exact_match")
        traj.finish("completed")

Token ids are stored exactly as given (token-in, token-out). When a caller hands over the
full input of a turn, the recorder checks the prefix invariant: the input must extend the
previous input plus output. Then only the appended tokens are stored; otherwise the full
input is stored and the turn is marked as TITO drift. A turn whose policy version is not known
(`policy_version=None`) stores it as unknown (null), never as version 0.

On SIGINT or SIGTERM (`trajlake.ingest.shutdown`, installed by the first Recorder of a process's
main thread unless the program set handlers of its own), every trajectory still open is finished
as a system failure (`error`, `infra`, the signal in its message) and published: a pre-empted
producer leaves no trajectory half-recorded, and its bus flushes or spools what it then holds.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from trajlake.ingest import shutdown
from trajlake.ingest.bus.base import Publisher
from trajlake.schemas import events as ev
from trajlake.schemas.errors import TrajlakeError


class RecorderError(TrajlakeError, RuntimeError):
    """The harness used the Recorder out of order (e.g. a turn after `finish`)."""


def extra_fields(event_type: str, extra: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The non-null `extra` keywords, each a field `event_type` carries that the method does not set itself.

    The accepted keywords come from the event model (`schemas/fields.py`), so a field
    declared there is accepted here without a new parameter.
    """
    if not extra:
        return {}
    allowed = ev.body_fields_of(event_type) - set(own)
    unknown = sorted(set(extra) - allowed)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {unknown} for a {event_type} event; "
            f"its other fields are: {', '.join(sorted(allowed)) or 'none'}"
        )
    return {k: v for k, v in extra.items() if v is not None}


def stopped_message(signal_name: str) -> str:
    """The message of a trajectory a stop cut short."""
    return f"the producer stopped on {signal_name} before the trajectory ended"


def _ids(values: Sequence[int] | Any) -> list[int]:
    return values.tolist() if hasattr(values, "tolist") else list(values)


class TrajectoryRecorder:
    """Records the events of one trajectory, with a per-trajectory `seq`."""

    def __init__(
        self,
        recorder: Recorder,
        trajectory_id: str,
        context_budget_tokens: int | None,
        vocab_size: int | None,
    ) -> None:
        self.recorder = recorder
        self.trajectory_id = trajectory_id
        self.context_budget_tokens = context_budget_tokens
        self.vocab_size = vocab_size
        self.context: list[int] = []
        self.turn_index = 0
        self.seq = 0
        self.finished = False
        self.drift_turns = 0
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.RLock()  # a stop may finish the trajectory from another thread

    # -- events ---------------------------------------------------------------------------
    def _emit(self, event_type: str, extra: Mapping[str, Any], /, **fields: Any) -> None:
        """Queue one event: the calling method's `fields` plus the caller's `extra` keywords."""
        with self._lock:
            if self.finished:
                raise RecorderError(
                    f"trajectory {self.trajectory_id} is finished; start a new one to record more"
                )
            event = ev.make_event(
                event_type,
                self.recorder.run_id,
                trajectory_id=self.trajectory_id,
                seq=self.seq,
                producer_id=self.recorder.producer_id,
                **{k: v for k, v in fields.items() if v is not None},
                **extra_fields(event_type, extra, fields),
            )
            self.seq += 1
            self._pending.append(event)

    def turn(
        self,
        output_token_ids: Sequence[int],
        output_logprobs: Sequence[float],
        policy_version: int | None,
        *,
        input_token_ids: Sequence[int] | None = None,
        full_input_token_ids: Sequence[int] | None = None,
        loss_mask: Sequence[bool] | None = None,
        finish_reason: str | None = None,
        context_used_fraction: float | None = None,
        nudged: bool = False,
        latency_s: float | None = None,
        **fields: Any,
    ) -> bool:
        """Record one model turn; return True if the input broke the prefix invariant (drift).

        Pass either `input_token_ids` (only what was appended since the last output) or
        `full_input_token_ids` (the whole prompt the engine saw; the recorder checks it).
        `policy_version`: the weight version that generated the turn; None when it is not known
        (stored as null: the sampler leaves such trajectories out, never takes them as fresh).
        Any other field a turn carries (`schemas/fields.py`) can be passed as a keyword.
        """
        if input_token_ids is not None and full_input_token_ids is not None:
            raise RecorderError(
                "pass input_token_ids (appended) or full_input_token_ids (whole input), not both"
            )
        output = _ids(output_token_ids)
        drift = False
        if full_input_token_ids is not None:
            full = _ids(full_input_token_ids)
            n = len(self.context)
            if full[:n] == self.context:
                appended = full[n:]
            else:
                appended, drift = full, True
                self.context = []
        else:
            appended = _ids(input_token_ids) if input_token_ids is not None else []
        self.context.extend(appended)
        self.context.extend(output)
        if context_used_fraction is None and self.context_budget_tokens:
            context_used_fraction = len(self.context) / self.context_budget_tokens
        mask = [bool(m) for m in loss_mask] if loss_mask is not None else [True] * len(output)
        self.drift_turns += drift
        self._emit(
            ev.TURN,
            fields,
            turn_index=self.turn_index,
            policy_version=None if policy_version is None else int(policy_version),
            input_token_ids=appended,
            input_is_full=drift,
            output_token_ids=output,
            output_logprobs=_ids(output_logprobs),
            loss_mask=mask,
            finish_reason=finish_reason,
            context_used_fraction=context_used_fraction,
            nudged=bool(nudged),
            tito_drift=drift,
            latency_s=latency_s,
            vocab_size=self.vocab_size,
        )
        self.turn_index += 1
        if self.recorder.flush_each_turn:
            self.flush()
        return drift

    def tool_call(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        call_id: str | None = None,
        is_code_execution: bool = False,
        **fields: Any,
    ) -> str:
        """Record that the model called a tool; return the call id to pass to `tool_result`."""
        call_id = call_id or uuid.uuid4().hex[:16]
        self._emit(
            ev.TOOL_CALL,
            fields,
            call_id=call_id,
            tool_name=tool_name,
            arguments=arguments,
            is_code_execution=is_code_execution,
        )
        return call_id

    def tool_result(
        self,
        call_id: str,
        tool_name: str,
        *,
        ok: bool,
        error_type: str | None = None,
        timed_out: bool = False,
        truncated: bool = False,
        output_tokens: int = 0,
        latency_s: float | None = None,
        retries: int = 0,
        is_code_execution: bool | None = None,
        **fields: Any,
    ) -> None:
        """Record a tool's outcome: ok, or the error type; timeouts and truncation are flagged."""
        self._emit(
            ev.TOOL_RESULT,
            fields,
            call_id=call_id,
            tool_name=tool_name,
            ok=ok,
            error_type=error_type,
            timed_out=timed_out,
            truncated=truncated,
            output_tokens=output_tokens,
            latency_s=latency_s,
            retries=retries,
            is_code_execution=is_code_execution,
        )

    def reward(
        self,
        value: float | None,
        *,
        components: Mapping[str, float] | None = None,
        verifier: str | None = None,
        verifier_error: str | None = None,
        **fields: Any,
    ) -> None:
        """Record the verifier's reward; `value=None` with `verifier_error` means no valid reward."""
        self._emit(
            ev.REWARD,
            fields,
            reward=value,
            reward_components=components,
            verifier=verifier,
            verifier_error=verifier_error,
        )

    def finish(
        self,
        status: str,
        *,
        failure_origin: str | None = None,
        failure_label: str | None = None,
        message: str | None = None,
        **fields: Any,
    ) -> None:
        """Record the end of the trajectory and publish everything still pending."""
        with self._lock:
            self._emit(
                ev.TRAJECTORY_FINISHED,
                fields,
                status=status,
                failure_origin=failure_origin,
                failure_label=failure_label,
                message=message,
            )
            self.finished = True
            self.recorder._closed(self)
            self.flush()

    def interrupt(self, why: str) -> bool:
        """Finish the trajectory as cut short by the system (`error`, `infra`); False if it had ended."""
        with self._lock:
            if self.finished:
                return False
            self.finish("error", failure_origin="system", failure_label="infra", message=why[:2000])
            return True

    def flush(self) -> None:
        """Publish pending events as one message."""
        with self._lock:
            if self._pending:
                pending, self._pending = self._pending, []
                self.recorder.bus.publish(pending)

    def __enter__(self) -> TrajectoryRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self.finished:
            return
        if exc is None:
            self.flush()
            return
        if isinstance(exc, KeyboardInterrupt):  # SIGINT/SIGTERM (`shutdown.StopRequested`), not the harness
            self.interrupt(stopped_message(getattr(exc, "name", "SIGINT")))
            return
        # A crash in the harness is the system's fault, never the model's: record it as such.
        message = f"{type(exc).__name__}: {exc}"[:2000]
        self.finish("error", failure_origin="system", failure_label="harness_behavior", message=message)


class Recorder:
    """Starts trajectories of one run and writes their events to a `Publisher` (a bus).

    `handle_signals`: install the stop handlers (`trajlake.ingest.shutdown`), which finish the
    open trajectories and flush the bus on SIGINT/SIGTERM.
    """

    def __init__(
        self,
        bus: Publisher,
        run_id: str,
        *,
        producer_id: str | None = None,
        vocab_size: int | None = None,
        flush_each_turn: bool = True,
        handle_signals: bool = True,
    ) -> None:
        self.bus = bus
        self.run_id = run_id
        self.producer_id = producer_id or f"{socket.gethostname()}:{os.getpid()}"
        self.vocab_size = vocab_size
        self.flush_each_turn = flush_each_turn
        self._open: weakref.WeakValueDictionary[str, TrajectoryRecorder] = weakref.WeakValueDictionary()
        self._open_lock = threading.Lock()
        shutdown.hold(self, shutdown.RECORD)
        if handle_signals:
            shutdown.install()

    def start(
        self,
        task_id: str,
        group_id: str | None = None,
        sample_index: int = 0,
        *,
        environment: str | None = None,
        harness: str | None = None,
        model: str | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        context_budget_tokens: int | None = None,
        tags: Sequence[str] | None = None,
        trajectory_id: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> TrajectoryRecorder:
        """Start a trajectory; `group_id` (the prompt group) defaults to the task id."""
        traj = TrajectoryRecorder(
            self, trajectory_id or ev.new_event_id(), context_budget_tokens, self.vocab_size
        )
        with self._open_lock:
            self._open[traj.trajectory_id] = traj
        traj._emit(
            ev.TRAJECTORY_STARTED,
            fields,
            task_id=task_id,
            group_id=group_id or task_id,
            sample_index=sample_index,
            environment=environment,
            harness=harness,
            model=model,
            sampling_params=sampling_params,
            context_budget_tokens=context_budget_tokens,
            vocab_size=self.vocab_size,
            tags=list(tags) if tags else None,
            attributes=attributes,
        )
        return traj

    def settle(self, deadline: float) -> str | None:
        """A stop: finish every open trajectory as interrupted and publish it (`shutdown.Holder`)."""
        stop = shutdown.requested()
        with self._open_lock:
            open_ = list(self._open.values())
        ended = sum(traj.interrupt(stopped_message(stop.name if stop else "a stop")) for traj in open_)
        if not ended:
            return None
        return (
            f"run {self.run_id}: recorded the {ended:,} open trajectories as ended by the stop "
            "(status error, system failure infra)"
        )

    def _closed(self, traj: TrajectoryRecorder) -> None:
        with self._open_lock:
            self._open.pop(traj.trajectory_id, None)

    def policy_updated(
        self, version: int, step: int, checkpoint: str | None = None, metrics: Mapping[str, Any] | None = None
    ) -> None:
        """Publish a trainer's `policy_updated` event (rollout workers pick the version up)."""
        self._publish_run_event(
            ev.POLICY_UPDATED, policy_version=version, step=step, checkpoint=checkpoint, metrics=metrics
        )

    def batch_consumed(
        self,
        step: int,
        trainer_version: int,
        trajectory_ids: Sequence[str],
        staleness: Sequence[int],
        advantages: Sequence[float] | None = None,
    ) -> None:
        """Publish a trainer's `batch_consumed` event: which trajectories a step used.

        `advantages`, when the trainer computed them, is each trajectory's advantage at this
        step (same order as `trajectory_ids`); `batch_consumption.advantage` keeps it.
        """
        if advantages is not None and len(advantages) != len(trajectory_ids):
            raise ValueError(f"{len(advantages)} advantages for {len(trajectory_ids)} consumed trajectories")
        self._publish_run_event(
            ev.BATCH_CONSUMED,
            step=step,
            trainer_version=trainer_version,
            consumed_trajectory_ids=list(trajectory_ids),
            consumed_staleness=list(staleness),
            consumed_advantages=None if advantages is None else [float(a) for a in advantages],
        )

    def _publish_run_event(self, event_type: str, **fields: Any) -> None:
        """Publish one event of the run (not of a trajectory) at once."""
        self.bus.publish([ev.make_event(event_type, self.run_id, producer_id=self.producer_id, **fields)])
