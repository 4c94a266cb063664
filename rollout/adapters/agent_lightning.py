"""Agent Lightning 1.0 into the lake: a poller on the server's log of finished rollouts.

Agent Lightning 1.0 (`python -m agentlightning.server`) keeps rollouts in memory; its model
proxy (`/proxy/rollout/{rid}/attempt/{aid}/mode/{train|val}/openai/v1/...`) forces
`return_token_ids` (and logprobs in train mode) and records each request and response as a
`model_request` event; the agent posts `reward` events. This adapter only talks HTTP, so it
needs no Agent Lightning package:

    GET /api/rollouts/terminal?after=<cursor>    append-only log of rollouts that reached
                                                 succeeded/failed, in completion order
    GET /api/rollouts/{id}                       the rollout, its attempts
    GET /api/rollouts/{id}/events?format=triplet prompt_token_ids, response_token_ids,
                                                 response_log_probs per model call (the
                                                 training view), and rewards
    GET /api/rollouts/{id}/events                the same calls in full (text, finish reason,
                                                 latency), joined on the event's timestamp

Each rollout becomes one trajectory, once: the log lists a rollout once (its terminal
transition is one-way), the events are the last attempt's (AGL's retries are attempts of one
rollout), and the trajectory id is derived from the rollout id, so a replay adds nothing.
The cursor is saved in the catalog only after the page it covers is committed to the lake; a
poller killed in between replays that page and skips what is stored. The server's store is
lost when it restarts: every page is read from the last rollout taken, and a log shorter than
the cursor, or another rollout at its place, starts the log again from 0 (stored rollouts are
skipped by id).

Token ids and logprobs are stored exactly as the engine returned them. A call without token
ids is stored as a turn with no tokens, its text in the turn's attributes and
`tokens_recorded: false`: it is never re-tokenised. A call without logprobs (val mode) keeps
its tokens with loss_mask 0.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from trajlake.ingest import shutdown
from trajlake.rollout import taxonomy
from trajlake.rollout.config import AgentLightningSettings
from trajlake.rollout.errors import RolloutError
from trajlake.rollout.importers.base import ImportReport, ImportSession, stable_trajectory_id
from trajlake.store.catalog import Catalog
from trajlake.store.lake import Lake

log = logging.getLogger(__name__)

SOURCE = "agent-lightning"
# the FastAPI app version the server reports in /openapi.json, per supported release
SUPPORTED_API_VERSIONS = {"1.0.0": "agentlightning 1.0.x"}
TERMINAL_PAGE_KEYS = frozenset({"items", "next_after", "total_terminal"})
UPSTREAM_INFRA_STATUSES = frozenset({408, 409, 429})  # and every 5xx: what AGL itself retries


class AgentLightningError(RolloutError):
    """The Agent Lightning server could not be read; `retryable` when it may come back."""

    def __init__(
        self, message: str, *, url: str, retryable: bool = False, status_code: int | None = None
    ) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.retryable = retryable
        self.status_code = status_code


class UnsupportedAgentLightning(AgentLightningError):
    """The server is not an Agent Lightning release this adapter follows (terminal)."""


# -- the server's records ---------------------------------------------------------------------
@dataclass
class AglCall:
    """One proxied model call: token ids and logprobs as the engine returned them, and its text."""

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    log_probs: list[float] | None
    policy_version: int | None = None  # the registered model's version; None: the record has none
    model: str | None = None
    finish_reason: str | None = None
    latency_s: float | None = None
    http_status: int | None = None
    error: str | None = None
    prompt_text: Any = None
    completion_text: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None or (self.http_status is not None and self.http_status >= 400)

    @property
    def has_tokens(self) -> bool:
        return bool(self.prompt_token_ids) and bool(self.response_token_ids)


@dataclass
class AglRollout:
    """A finished rollout and the last attempt's model calls and rewards."""

    rollout_id: str
    state: str
    data_id: str
    is_train: bool
    metadata: dict[str, Any]
    error_message: str | None
    attempt_id: str
    attempts: list[str]
    calls: list[AglCall] = field(default_factory=list)
    rewards: list[dict[str, Any]] = field(default_factory=list)
    dropped_calls: int = 0  # earlier calls with the same prompt, which AGL's training view drops

    @classmethod
    def from_api(
        cls,
        detail: Mapping[str, Any],
        triplets: Sequence[Mapping[str, Any]],
        full: Sequence[Mapping[str, Any]],
    ) -> AglRollout:
        """Build from `/api/rollouts/{id}` and its events (triplet view and full view)."""
        rollout, status = detail["rollout"], detail["rollout"]["status"]
        inp = rollout.get("input")
        data_id = str(
            (inp.get("data_id") or inp.get("instance_id") or "") if isinstance(inp, Mapping) else ""
        )
        by_time = {(e["event_type"], e["timestamp"]): e.get("data") or {} for e in full}
        calls = [
            _call(e.get("data") or {}, by_time.get(("model_request", e["timestamp"]), {}))
            for e in triplets
            if e["event_type"] == "model_request"
        ]
        return cls(
            rollout_id=str(rollout["rollout_id"]),
            state=str(status["state"]),
            data_id=data_id,
            is_train=bool(rollout.get("is_train", True)),
            metadata=dict(rollout.get("metadata") or {}),
            error_message=status.get("error_message"),
            attempt_id=str(status.get("last_attempt_id") or "0"),
            attempts=list(detail.get("attempts") or []),
            calls=calls,
            rewards=[dict(e.get("data") or {}) for e in full if e["event_type"] == "reward"],
            dropped_calls=sum(e["event_type"] == "model_request" for e in full) - len(calls),
        )

    def outcome(self) -> tuple[taxonomy.Failure, float | None, str | None]:
        """(failure, reward or None, verifier error) per the failure taxonomy."""
        reward = self.rewards[-1] if self.rewards else None
        value = None if reward is None or reward.get("value") is None else float(reward["value"])
        fallback = reward is not None and reward.get("source") == "fallback"
        if self.state == "failed":
            failure = self._failure()
            if failure.reward_valid and value is not None and not fallback:
                return failure, value, None
            return failure, None, f"the rollout failed: {self.error_message or 'no error message'}"[:500]
        if value is None:
            return taxonomy.VERIFIER_FAILED, None, "the rollout succeeded without a reward event"
        if fallback and reward is not None:  # the runner filled a reward in: the evaluator gave none
            why = reward.get("reason") or reward.get("message") or "no reason given"
            return taxonomy.VERIFIER_FAILED, None, f"fallback reward {value} ({why})"[:500]
        return taxonomy.COMPLETED, value, None

    def _failure(self) -> taxonomy.Failure:
        """Why a failed rollout failed: the engine's last error if a call failed, else the runner's message."""
        failed = [c for c in self.calls if c.failed]
        if failed:
            last = failed[-1]
            if last.http_status in UPSTREAM_INFRA_STATUSES or (last.http_status or 0) >= 500:
                return taxonomy.INFRA_FAILED
            found = taxonomy.classify_exception_name(None, last.error)
            if found is not taxonomy.HARNESS_FAILED:
                return found
        # no known cause: the runner's fault until shown otherwise (a system failure is never trained on)
        return taxonomy.classify_exception_name(None, self.error_message)

    def message(self) -> str | None:
        if self.state != "failed":
            return None
        errors = [c.error for c in self.calls if c.error]
        text = self.error_message or "failed"
        return (f"{text}; last engine error: {errors[-1]}" if errors else text)[:2000]


def _call(triplet: Mapping[str, Any], full: Mapping[str, Any]) -> AglCall:
    server = triplet.get("server") or {}
    request = full.get("request") or {}
    raw = full.get("response")
    response: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    choices = response.get("choices") or [{}]
    choice: Mapping[str, Any] = choices[0] if isinstance(choices[0], Mapping) else {}
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else None
    error = triplet.get("error") or response.get("error")
    if isinstance(error, Mapping):  # OpenAI/vLLM error bodies: {"error": {"message": ..., "code": 400}}
        error = error.get("message") or json.dumps(error)
    if error is None and triplet.get("status") == "error":
        error = response.get("message") or response.get("detail") or f"HTTP {triplet.get('http_status')}"
    latency_ms = full.get("latency_ms")
    return AglCall(
        prompt_token_ids=[int(t) for t in triplet.get("prompt_token_ids") or []],
        response_token_ids=[int(t) for t in triplet.get("response_token_ids") or []],
        log_probs=triplet.get("response_log_probs"),
        policy_version=None if server.get("version") is None else int(server["version"]),
        model=server.get("model"),
        finish_reason=full.get("finish_reason") or (choice.get("finish_reason") if choice else None),
        latency_s=None if latency_ms is None else float(latency_ms) / 1000,
        http_status=triplet.get("http_status"),
        error=None if error is None else str(error),
        prompt_text=request.get("messages", request.get("prompt")),
        completion_text=message.get("content") if message is not None else choice.get("text"),
    )


# -- the HTTP client -----------------------------------------------------------------------------
class AglClient:
    """The few read routes of an Agent Lightning 1.0 server."""

    def __init__(self, config: AgentLightningSettings, transport: httpx.BaseTransport | None = None) -> None:
        self.url = config.server.rstrip("/")
        headers = {"authorization": f"Bearer {config.key}"} if config.key else {}
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=config.timeout_s, transport=transport
        )

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, **params: Any) -> Any:
        try:
            response = self.http.get(path, params=params or None)
        except httpx.TransportError as err:
            raise AgentLightningError(
                f"cannot reach the server ({type(err).__name__}: {err}); is `python -m agentlightning.server` "
                "running there? pass its root with --server",
                url=self.url,
                retryable=True,
            ) from err
        if response.status_code == 401:
            raise AgentLightningError(
                "the server wants an API key; pass --key or TRAJLAKE_AGL_KEY", url=self.url
            )
        if response.status_code >= 500:
            raise AgentLightningError(
                f"GET {path} answered {response.status_code}",
                url=self.url,
                retryable=True,
                status_code=response.status_code,
            )
        if response.status_code >= 400:
            raise AgentLightningError(
                f"GET {path} answered {response.status_code}: {response.text[:300]}",
                url=self.url,
                status_code=response.status_code,
            )
        return response.json()

    def check_version(self) -> str:
        """The server's API version; raise `UnsupportedAgentLightning` unless this adapter follows it."""
        supported = ", ".join(f"{v} ({r})" for v, r in SUPPORTED_API_VERSIONS.items())
        try:
            info = self._get("/openapi.json").get("info") or {}
        except AgentLightningError as err:
            if err.retryable:
                raise
            info = {}  # the schema route may be switched off: the page shape below decides
        if info and (
            info.get("title") != "Agent Lightning" or info.get("version") not in SUPPORTED_API_VERSIONS
        ):
            raise UnsupportedAgentLightning(
                f"the server is {info.get('title')!r} API version {info.get('version')!r}; this adapter "
                f"supports Agent Lightning API version {supported}",
                url=self.url,
            )
        page = self.terminal_page(0, 1)
        if not isinstance(page, Mapping) or not set(page) >= TERMINAL_PAGE_KEYS:
            raise UnsupportedAgentLightning(
                "GET /api/rollouts/terminal did not answer a page of terminal rollouts "
                f"(items, next_after, total_terminal); this adapter supports Agent Lightning API version {supported}",
                url=self.url,
            )
        return str(info.get("version") or "unknown")

    def terminal_page(self, after: int, limit: int) -> dict[str, Any]:
        """One page of the completion log: items, next_after, total_terminal."""
        return self._get("/api/rollouts/terminal", after=after, limit=limit)

    def rollout(self, rollout_id: str) -> AglRollout | None:
        """The rollout and its last attempt's events; None when it was deleted meanwhile."""
        try:
            detail = self._get(f"/api/rollouts/{rollout_id}")
            triplets = self._get(f"/api/rollouts/{rollout_id}/events", format="triplet")
            full = self._get(f"/api/rollouts/{rollout_id}/events")
        except AgentLightningError as err:
            if err.status_code == 404:
                return None
            raise
        return AglRollout.from_api(detail, triplets, full)


# -- recording -----------------------------------------------------------------------------------
def trajectory_id_of(run_id: str, rollout_id: str) -> str:
    """The trajectory id of an Agent Lightning rollout in `run_id` (the same on every replay)."""
    return stable_trajectory_id(run_id, SOURCE, rollout_id)


def record_rollout(session: ImportSession, rollout: AglRollout) -> bool:
    """Record one finished rollout as a trajectory; False when it is already in the lake."""
    trajectory_id = trajectory_id_of(session.report.run_id, rollout.rollout_id)
    if session.already_imported(trajectory_id):
        return False
    turns = [c for c in rollout.calls if not c.failed]
    no_tokens = sum(not c.has_tokens for c in turns)
    no_logprobs = sum(c.has_tokens and c.log_probs is None for c in turns)
    failure, reward, verifier_error = rollout.outcome()
    meta = rollout.metadata
    traj = session.recorder.start(
        rollout.data_id or rollout.rollout_id,
        rollout.data_id or rollout.rollout_id,
        int(meta.get("sample_idx_in_batch") or 0),
        harness=SOURCE,
        model=next((c.model for c in rollout.calls if c.model), None),
        tags=["train" if rollout.is_train else "val"],
        trajectory_id=trajectory_id,
        attributes={
            "source": SOURCE,
            "rollout_id": rollout.rollout_id,
            "attempt_id": rollout.attempt_id,
            "attempts": rollout.attempts,
            "state": rollout.state,
            "batch_idx": meta.get("batch_idx"),
            "turns_without_tokens": no_tokens,
            "turns_without_logprobs": no_logprobs,
            "failed_calls": len(rollout.calls) - len(turns),
            "dropped_calls": rollout.dropped_calls,
            "rewards": rollout.rewards,
        },
    )
    for i, call in enumerate(turns):
        version = session.policy_version if call.policy_version is None else call.policy_version
        if not call.has_tokens:  # kept as text, never re-tokenised: no loss may be taken on it
            session.report.warnings.append(f"{rollout.rollout_id}: call {i} has no token ids; stored as text")
            traj.turn([], [], version, input_token_ids=[], finish_reason=call.finish_reason,
                      latency_s=call.latency_s, attributes={"tokens_recorded": False, "prompt": call.prompt_text,
                                                            "completion": call.completion_text})  # fmt: skip
        else:
            logprobs, mask = call.log_probs, None
            if logprobs is None:
                n = len(call.response_token_ids)
                logprobs, mask = [0.0] * n, [False] * n
                session.report.warnings.append(f"{rollout.rollout_id}: call {i} has no logprobs; loss_mask 0")
            traj.turn(call.response_token_ids, logprobs, version,
                      full_input_token_ids=call.prompt_token_ids, loss_mask=mask,
                      finish_reason=call.finish_reason, latency_s=call.latency_s)  # fmt: skip
        session.report.turns += 1
    if reward is not None or verifier_error is not None:
        components = {
            f"reward_{i}": float(r["value"])
            for i, r in enumerate(rollout.rewards)
            if r.get("value") is not None
        }
        traj.reward(reward, components=components if len(components) > 1 else None, verifier=SOURCE,
                    verifier_error=verifier_error)  # fmt: skip
    traj.finish(
        failure.status,
        failure_origin=failure.origin,
        failure_label=failure.label,
        message=rollout.message(),
    )
    session.done_one(trajectory_id)
    return True


# -- the poller ----------------------------------------------------------------------------------
class AglPoller:
    """Reads the terminal-rollouts log page by page into the lake; the cursor lives in the catalog."""

    def __init__(
        self,
        lake: Lake,
        catalog: Catalog,
        client: AglClient,
        run_id: str,
        config: AgentLightningSettings,
        policy_version: int | None = None,
        producer_id: str | None = None,
    ) -> None:
        self.lake, self.catalog, self.client = lake, catalog, client
        self.run_id, self.config = run_id, config
        self.cursor_key = f"{SOURCE}:{client.url}"
        self.session = ImportSession(
            lake,
            run_id,
            SOURCE,
            batch=config.page_size,
            policy_version=policy_version,
            producer_id=producer_id,
        )
        saved = catalog.source_cursor(run_id, self.cursor_key)
        self.position: int = saved[0] if saved is not None else 0
        self.last_key: str | None = saved[1] if saved is not None else None

    def _restart_log(self, why: str) -> None:
        # the server's store is in memory: after a restart its log starts again, and the ids of
        # what is already stored make reading it from 0 safe
        self.session.report.warnings.append(f"{why} (the server restarted?); reading its log from 0")
        self.position, self.last_key = 0, None

    def poll_once(self, on_rollout: Callable[[AglRollout], None] | None = None) -> bool:
        """Import one page; return True when the poller has caught up with the log."""
        # read from the last rollout taken: if another one is there now, the log was reset
        start = self.position - 1 if self.last_key is not None and self.position > 0 else self.position
        page = self.client.terminal_page(start, self.config.page_size + (self.position - start))
        items, total, next_after = page["items"], int(page["total_terminal"]), int(page["next_after"])
        if total < self.position:
            self._restart_log(f"the log has {total} rollouts, fewer than the saved cursor {self.position}")
            return False
        if start < self.position:
            if not items or items[0]["rollout_id"] != self.last_key:
                self._restart_log(f"rollout {self.last_key} is no longer at position {start}")
                return False
            items = items[1:]
        for item in items:
            rollout = self.client.rollout(item["rollout_id"])
            if rollout is None:
                continue  # deleted since it finished: nothing left to store
            with self.session.recording():
                record_rollout(self.session, rollout)
            if on_rollout is not None:
                on_rollout(rollout)
        self.session.drain()  # committed to the lake first, then the cursor: a crash in between replays
        if next_after > self.position:
            # a rollout deleted from the server is skipped in `items`: then the last item is not the
            # one at next_after - 1, and the next poll cannot check continuity (it reads on)
            whole = len(page["items"]) == next_after - start
            self.last_key = items[-1]["rollout_id"] if items and whole else None
            self.position = next_after
            self.catalog.save_source_cursor(self.run_id, self.cursor_key, self.position, self.last_key)
        return next_after >= total

    def run(
        self,
        stop_event: threading.Event | None = None,
        on_rollout: Callable[[AglRollout], None] | None = None,
        on_poll: Callable[[], None] | None = None,
    ) -> ImportReport:
        """Import until caught up, or with `follow` until `stop_event` is set or a stop signal
        (`shutdown.StopRequested`) comes; return the report (`stopped_by` names the signal).

        `on_poll` runs after every poll, caught up or not (a follower's progress line while idle).
        """
        stop_event = stop_event or threading.Event()
        try:
            while not stop_event.is_set():
                try:
                    caught_up = self.poll_once(on_rollout)
                except AgentLightningError as err:
                    if not (self.config.follow and err.retryable):
                        raise
                    # the server may be restarting: a follower waits for it
                    log.warning("%s; retrying in %.1f s", err, self.config.poll_interval_s)
                    caught_up = True
                if on_poll is not None:
                    on_poll()
                if caught_up:
                    if not self.config.follow:
                        break
                    stop_event.wait(self.config.poll_interval_s)
        except (
            shutdown.StopRequested
        ) as stop:  # every rollout recorded is committed; the cursor is at its page
            return self.session.close(stop)
        return self.session.close()


def import_agent_lightning(
    lake: Lake,
    config: AgentLightningSettings,
    run_id: str,
    *,
    catalog_url: str | None = None,
    stop_event: threading.Event | None = None,
    on_rollout: Callable[[AglRollout], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    policy_version: int | None = None,
    producer_id: str | None = None,
) -> ImportReport:
    """Import the finished rollouts of an Agent Lightning server into `lake` under `run_id`;
    `policy_version`: of calls whose record has no model version (unknown when None);
    `producer_id`: what the events carry (default `trajlake-import-agent-lightning`)."""
    client = AglClient(config)
    catalog = Catalog.for_lake(lake.root, catalog_url)
    try:
        client.check_version()
        poller = AglPoller(lake, catalog, client, run_id, config, policy_version, producer_id)
        return poller.run(stop_event, on_rollout, on_poll)
    finally:
        client.close()
        catalog.close()
