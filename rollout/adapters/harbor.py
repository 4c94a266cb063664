"""Harbor 0.25 into the lake, live: a `job.on_trial_ended` hook that records each trial as it ends.

The lines a user adds (harbor is imported only inside this module's functions, so trajlake
installs and imports without it):

    hook = HarborHook(recorder)          # a trajlake Recorder on a bus
    hook.attach(job)                     # job.on_trial_ended(hook), retries read from job.config.retry
    # or, per trial: trial.add_hook(TrialEvent.END, hook)

Each trial becomes one trajectory, mapped exactly as `trajlake import harbor` maps a finished
trial directory (one shared mapping, `trajlake.rollout.importers.harbor`): the hook hands the
`TrialResult` Harbor passes to `on_trial_ended` and the trial directory (for the ATIF
`agent/trajectory.json`) to `HarborTrial.from_result`. Token ids and logprobs come from
`agent_result.rollout_details` (else the ATIF step metrics) exactly as the engine returned
them; a trial without them keeps its outcome and no turns, never re-tokenised.

Ended exactly once: Harbor emits END for every attempt of a trial and, when it retries, runs
the trial again under the same name (after deleting the failed attempt's directory). The hook
decides at END, with Harbor's own rule (`RetryConfig`: `max_retries`, include/exclude
exception types), whether this attempt is the trial's last: the last one is the trial's
trajectory (the id `trajlake import harbor` gives it, so importing the job afterwards adds
nothing); an abandoned attempt is a trajectory of its own (id from the attempt's result id),
ended as a system failure tagged `retried`, its reward never trained on. An END seen twice
(the hook attached twice, a replay) is recorded once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from trajlake.ingest.recorder import Recorder
from trajlake.rollout.adapters import check_release, installed_release, supported_releases
from trajlake.rollout.errors import RolloutError
from trajlake.rollout.importers.base import RecordedTrajectory, stable_trajectory_id
from trajlake.rollout.importers.harbor import HarborTrial, record_trial, trajectory_id_of

SOURCE = "harbor"
SUPPORTED_VERSIONS = ("0.25",)  # Harbor release lines (major.minor) whose TrialResult this maps
HOST_ENVIRONMENT = "trajlake.rollout.adapters.harbor_host:HostEnvironment"  # EnvironmentConfig.import_path


class UnsupportedHarbor(RolloutError):
    """The Harbor release is not one this adapter maps."""


def supported() -> str:
    return supported_releases("harbor", SUPPORTED_VERSIONS)


def check_version(version: str | None) -> None:
    """Raise `UnsupportedHarbor` unless `version` is a release line this adapter maps."""
    check_release("harbor", version, SUPPORTED_VERSIONS, UnsupportedHarbor)


def installed_version() -> str:
    """The installed Harbor release; raise `UnsupportedHarbor` unless it is supported."""
    return installed_release("harbor", SUPPORTED_VERSIONS, UnsupportedHarbor, "harbor")


def trial_dir_of(result: Any, config: Any = None) -> Path | None:
    """The trial's directory: the result's `trial_uri` (file://), else the config's trials_dir/trial_name."""
    uri = str(getattr(result, "trial_uri", "") or "")
    if uri.startswith("file://"):
        return Path(unquote(urlparse(uri).path))
    if config is not None and getattr(config, "trials_dir", None) is not None:
        return Path(config.trials_dir) / str(config.trial_name)
    return None


def will_retry(retry: Any, exception_type: str | None, attempt: int) -> bool:
    """Harbor 0.25's rule (`TrialQueue._execute_trial_with_retries`): is attempt `attempt` (0-based) run again?"""
    if retry is None or exception_type is None or attempt >= int(retry.max_retries):
        return False
    if retry.exclude_exceptions and exception_type in retry.exclude_exceptions:
        return False
    return not (retry.include_exceptions and exception_type not in retry.include_exceptions)


class HarborHook:
    """An async Harbor trial hook (`TrialEvent.END`) that records each trial through a `Recorder`.

    `retry`: the job's `RetryConfig` (`attach` reads it from `job.config.retry`); without it no
    attempt is taken as retried. `policy_version`: the weight version served (an int, or a
    callable read as each trial is recorded); None (Harbor records none) stores it as unknown.
    Safe to share between concurrent trials.
    """

    def __init__(
        self,
        recorder: Recorder,
        *,
        retry: Any = None,
        policy_version: int | Callable[[], int | None] | None = None,
    ) -> None:
        self.version = installed_version()
        self.recorder = recorder
        self.retry = retry
        self.policy_version = policy_version
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # result ids already recorded
        self._attempts: dict[str, int] = {}  # trial name -> attempts ended so far
        self._samples: dict[str, int] = {}  # task name -> trials recorded so far
        self.trajectories = 0
        self.retried = 0
        self.turns = 0
        self.tokens = 0
        self.warnings: list[str] = []

    def attach(self, job: Any) -> Any:
        """Register on `job` (`job.on_trial_ended`) with its retry settings; return the job."""
        self.retry = job.config.retry
        return job.on_trial_ended(self)

    async def __call__(self, event: Any) -> None:
        """The END hook: record `event.result` (a `TrialHookEvent`'s)."""
        self.record(event.result, config=getattr(event, "config", None))

    def record(self, result: Any, *, config: Any = None) -> RecordedTrajectory | None:
        """Record one ended attempt (a `TrialResult`); None if this attempt was recorded already."""
        exception = result.exception_info.exception_type if result.exception_info is not None else None
        with self._lock:
            if str(result.id) in self._seen:
                return None
            self._seen.add(str(result.id))
            attempt = self._attempts.get(result.trial_name, 0)
            self._attempts[result.trial_name] = attempt + 1
            retried = will_retry(self.retry, exception, attempt)
            sample = self._samples.get(result.task_name, 0)
            if not retried:
                self._samples[result.task_name] = sample + 1
        trial = HarborTrial.from_result(result.model_dump(mode="json"), trial_dir_of(result, config))
        if retried:
            trajectory_id = stable_trajectory_id(
                self.recorder.run_id, SOURCE, f"{result.trial_name}#{result.id}"
            )
            why = f"attempt {attempt + 1} of {int(self.retry.max_retries) + 1} raised {exception}"
        else:
            trajectory_id, why = trajectory_id_of(self.recorder.run_id, result.trial_name), None
        version = self.policy_version() if callable(self.policy_version) else self.policy_version
        rec = record_trial(self.recorder, trial, sample, trajectory_id=trajectory_id, retried=why,
                           policy_version=version)  # fmt: skip
        with self._lock:
            self.trajectories += 1
            self.retried += bool(retried)
            self.turns += rec.turns
            self.tokens += rec.tokens
            self.warnings.extend(rec.warnings)
        return rec
