"""verifiers 0.4 (`verifiers.v1`, prime-rl's environments) into the lake: live taps and an importer.

Where a run is, in the lines a user adds (verifiers is imported only inside this module's
functions, so trajlake installs and imports without it):

    tap = VerifiersTap(recorder)                        # a trajlake Recorder on a bus
    episode = await tap.run_episode(env, task, ctx)     # in-process: Env.run_episode(on_trace=..., on_discard=...)
    episode = await tap.run_client(env_client, client, model, sampling, task_data)
                                                        # prime-rl: EnvClient.run(on_delta=...)
    trajlake import verifiers traces.jsonl --lake L --run R      # a finished `vf-eval` run

Each verifiers `Trace` (one agent's rollout) becomes one trajectory, its id derived from the
trace id, ended exactly once: a per-agent retry (`on_discard`, or a `discard` delta) ends the
abandoned trace at once as a system failure tagged `retried`; a whole-episode retry leaves
earlier traces out of the final episode, and they are ended the same way when the episode is
done; a trace seen twice (a replayed delta, a second import) is skipped.

Turns are the trace's sampled `MessageNode`s in graph order. A turn's input is the path's
token ids up to the node's generation prompt, its output the node's masked (`mask`) tokens,
with the node's `logprobs` exactly as the engine returned them (the Recorder flags TITO drift
where a turn's prompt does not extend the previous turn's tokens, as on a new branch after
compaction). A sampled node without token ids (verifiers' eval client keeps none) is stored
as a turn with no tokens, its text in the turn's attributes and `tokens_recorded: false`: it
is never re-tokenised. `traces.jsonl` rounds logprobs to 4 decimals (verifiers'
`RECORD_FLOAT_DECIMALS`); imported trajectories say so (`logprobs_rounded`), live ones keep
every digit. Rewards are the trace's named, weighted rewards (their weighted sum, the
components by name); typed errors and stop conditions map to trajlake's failure taxonomy.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trajlake.ingest.recorder import Recorder
from trajlake.rollout import taxonomy
from trajlake.rollout.errors import ImportFormatError, RolloutError
from trajlake.rollout.importers.base import (
    ImportReport,
    ImportSession,
    RecordedTrajectory,
    stable_trajectory_id,
)
from trajlake.store.lake import Lake

SOURCE = "verifiers"
SUPPORTED_VERSIONS = ("0.4",)  # verifiers release lines (major.minor) whose Trace this maps
SUPPORTED_TRACE_VERSIONS = (1,)  # verifiers' TRACE_VERSION
ROUNDED_DECIMALS = 4  # verifiers' RECORD_FLOAT_DECIMALS: JSON records round logprobs to this


class UnsupportedVerifiers(RolloutError):
    """The verifiers release (or its trace schema) is not one this adapter maps."""


def supported() -> str:
    return ", ".join(f"verifiers {v}.x" for v in SUPPORTED_VERSIONS) + (
        f" (trace schema version {', '.join(map(str, SUPPORTED_TRACE_VERSIONS))})"
    )


def check_version(version: str | None, trace_version: int | None = None) -> None:
    """Raise `UnsupportedVerifiers` unless `version` (and the trace schema) is one this adapter maps."""
    line = ".".join(str(version or "").split(".")[:2])
    if line not in SUPPORTED_VERSIONS:
        raise UnsupportedVerifiers(
            f"verifiers {version or 'of unknown version'} is not supported; this adapter supports {supported()}"
        )
    if trace_version is not None and trace_version not in SUPPORTED_TRACE_VERSIONS:
        raise UnsupportedVerifiers(
            f"verifiers trace schema version {trace_version} is not supported; this adapter supports {supported()}"
        )


def installed_version() -> str:
    """The installed verifiers release; raise `UnsupportedVerifiers` unless it is supported."""
    try:
        import verifiers
    except ImportError as err:
        raise UnsupportedVerifiers(
            f"verifiers is not installed here; install one of: {supported()} "
            "(scripts/framework-venv.sh verifiers builds a venv with it)"
        ) from err
    version = str(getattr(verifiers, "__version__", ""))
    check_version(version)
    return version


# -- failures ------------------------------------------------------------------------------------
_STOPS: dict[str, taxonomy.Failure] = {
    "max_turns": taxonomy.MAX_TURNS,
    "max_input_tokens": taxonomy.CONTEXT_EXHAUSTED,
    "max_output_tokens": taxonomy.CONTEXT_EXHAUSTED,
    "max_total_tokens": taxonomy.CONTEXT_EXHAUSTED,
    "compaction_failed": taxonomy.CONTEXT_EXHAUSTED,
    "agent_timeout": taxonomy.AGENT_TIMEOUT,
    "setup_timeout": taxonomy.ENV_FAILED,
    "finalize_timeout": taxonomy.VERIFIER_FAILED,
    "scoring_timeout": taxonomy.VERIFIER_FAILED,
    "empty_action": taxonomy.MALFORMED_TOOL_CALLS,  # the model answered with nothing usable
}


def classify_error(error: Mapping[str, Any], *, scoring_started: bool = False) -> taxonomy.Failure:
    """The failure one of verifiers' typed errors (`Trace.errors[i]`) stands for."""
    kind, message = str(error.get("type") or ""), str(error.get("message") or "")
    status = error.get("status_code")
    by_text = taxonomy.classify_exception_name(None, message)
    if kind == "ProviderError":
        # the engine or the provider failed the call; a prompt too long is the model's
        if by_text is taxonomy.CONTEXT_EXHAUSTED:
            return by_text
        return taxonomy.INFRA_FAILED
    if kind in ("SandboxError", "InterceptionError", "TunnelError"):
        return taxonomy.INFRA_FAILED
    if kind == "ToolsetError":
        return taxonomy.TOOL_BROKEN
    if kind == "TaskError":  # task code raised: in scoring, the verifier; else the environment
        return taxonomy.VERIFIER_FAILED if scoring_started else taxonomy.ENV_FAILED
    if kind == "HarnessError":
        # the harness exits 1 on a model-call failure it cannot handle; its message has the cause
        if by_text is taxonomy.CONTEXT_EXHAUSTED:
            return by_text
        if any(f"Error code: {code}" in message for code in (429, 500, 502, 503, 504)):
            return taxonomy.INFRA_FAILED
        return taxonomy.HARNESS_FAILED
    if kind == "EnvError":
        return taxonomy.HARNESS_FAILED
    found = taxonomy.classify_exception_name(kind, message)
    if found is taxonomy.HARNESS_FAILED and isinstance(status, int) and (status == 429 or status >= 500):
        return taxonomy.INFRA_FAILED
    return found


def _clip(text: str, limit: int = 2000) -> str:
    """`text` within `limit` characters, its head and its tail kept (a harness's traceback ends with the cause)."""
    return text if len(text) <= limit else f"{text[:300]} … {text[-(limit - 303) :]}"


def outcome(trace: Mapping[str, Any]) -> tuple[taxonomy.Failure, str | None]:
    """(failure, message) of a finished trace, per the failure taxonomy."""
    errors = list(trace.get("errors") or [])
    stop = trace.get("stop_condition")
    scoring = bool(((trace.get("timing") or {}).get("scoring") or {}).get("start"))
    if errors:
        last = errors[-1]
        failure = classify_error(last, scoring_started=scoring)
        return failure, _clip(f"{last.get('type')}: {last.get('message')}")
    if stop in _STOPS:
        return _STOPS[stop], f"stop condition {stop}"
    if not trace.get("ok", True):
        return taxonomy.HARNESS_FAILED, f"the trace ended without ok (stop condition {stop})"
    return taxonomy.COMPLETED, None


# -- the mapping ---------------------------------------------------------------------------------
def trajectory_id_of(run_id: str, trace_id: str) -> str:
    """The trajectory id of a verifiers trace in `run_id` (the same live, replayed or imported)."""
    return stable_trajectory_id(run_id, SOURCE, trace_id)


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, Mapping))
    return str(content)


def _path(nodes: Sequence[Mapping[str, Any]], index: int) -> list[int]:
    path: list[int] = []
    current: int | None = index
    while current is not None:
        path.append(current)
        current = nodes[current].get("parent")
    path.reverse()
    return path


def record_trace(
    recorder: Recorder,
    trace: Mapping[str, Any],
    *,
    policy_version: int | None = None,
    sample_index: int = 0,
    retried: str | None = None,
    rounded: bool = False,
    renderer_drift: Iterable[int] = (),
    group_id: str | None = None,
) -> RecordedTrajectory:
    """Record one verifiers trace (a `Trace` dumped to a dict) as one finished trajectory.

    `retried`: the trace was abandoned by a verifiers retry (why); it ends as a system failure.
    `rounded`: the logprobs came from a JSON record (4 decimals). `renderer_drift`: sampled node
    indices whose renderer token ids differ from the engine's (flagged on the turn).
    """
    verifiers_version = (trace.get("verifiers") or {}).get("version")
    check_version(verifiers_version, trace.get("version"))
    trace_id = str(trace["id"])
    task = trace.get("task") or {}
    task_id = str(task.get("key") or task.get("hash") or trace_id)
    agent = trace.get("agent") or {}
    nodes: list[Mapping[str, Any]] = list(trace.get("nodes") or [])
    calls = [c for c in trace.get("calls") or [] if isinstance(c, Mapping)]
    by_node = {c["node"]: c for c in calls if c.get("node") is not None}
    failed_calls = [c for c in calls if c.get("error")]
    drift_nodes = set(renderer_drift)
    model = next((c.get("model") for c in calls if c.get("model")), None)
    result = RecordedTrajectory(trajectory_id_of(recorder.run_id, trace_id))
    tags = ["retried"] if retried else []
    if not agent.get("trainable", True):
        tags.append("not_trainable")
    traj = recorder.start(
        task_id,
        group_id or task_id,
        sample_index,
        harness=SOURCE,
        environment=str(task.get("type") or "") or None,
        model=model,
        tags=tags,
        trajectory_id=result.trajectory_id,
        attributes={
            "source": SOURCE,
            "trace_id": trace_id,
            "verifiers_version": verifiers_version,
            "agent": agent.get("name"),
            "stop_condition": trace.get("stop_condition"),
            "is_timeout": trace.get("is_timeout"),
            "branches": sum(1 for i in range(len(nodes)) if i not in {n.get("parent") for n in nodes}),
            "failed_calls": [
                {
                    "type": (c["error"] or {}).get("type"),
                    "message": str((c["error"] or {}).get("message"))[:500],
                }
                for c in failed_calls
            ],
            "logprobs_rounded": ROUNDED_DECIMALS if rounded else None,
            "retried": retried,
            "metrics": trace.get("metrics") or None,
        },
    )
    context: dict[int, list[int]] = {}  # node index -> the path's token ids up to and including it
    open_calls: dict[str, str] = {}  # verifiers tool call id -> trajlake call id
    for i, node in enumerate(nodes):
        parent = node.get("parent")
        ids = [int(t) for t in node.get("token_ids") or []]
        context[i] = [*(context.get(parent, []) if parent is not None else []), *ids]
        message = node.get("message") or {}
        role = message.get("role")
        if role == "tool" and message.get("tool_call_id") in open_calls:
            traj.tool_result(
                open_calls.pop(message["tool_call_id"]), str(message.get("name") or "tool"), ok=True,
                output_tokens=len(ids),
            )  # fmt: skip
        if not node.get("sampled"):
            continue
        call = by_node.get(i) or {}
        span = call.get("time") or {}
        latency = (span["end"] - span["start"]) if span.get("end") and span.get("start") else None
        mask = [bool(m) for m in node.get("mask") or []]
        if not ids:  # no token ids (an eval client, a text-only record): the text, never re-tokenised
            result.warnings.append(f"{trace_id}: turn {result.turns} has no token ids; stored as text")
            traj.turn([], [], policy_version, input_token_ids=[], finish_reason=call.get("finish_reason"),
                      latency_s=latency, attributes={"tokens_recorded": False, "node": i,
                                                     "completion": _text(message.get("content"))})  # fmt: skip
        else:
            first = mask.index(True) if True in mask else len(ids)
            output = [t for t, m in zip(ids, mask, strict=False) if m]
            logprobs = [float(x) for x in node.get("logprobs") or []]
            loss_mask = None
            if len(logprobs) != len(output):
                result.warnings.append(
                    f"{trace_id}: node {i} has {len(logprobs)} logprobs for {len(output)} sampled tokens; loss_mask 0"
                )
                logprobs, loss_mask = [0.0] * len(output), [False] * len(output)
            before = context.get(parent, []) if parent is not None else []
            traj.turn(output, logprobs, policy_version, full_input_token_ids=[*before, *ids[:first]],
                      loss_mask=loss_mask, finish_reason=call.get("finish_reason"), latency_s=latency,
                      attributes={"node": i, "renderer_drift": True} if i in drift_nodes else {"node": i})  # fmt: skip
            result.tokens += len(ids)
        result.turns += 1
        for tc in message.get("tool_calls") or []:
            call_id = traj.tool_call(str(tc.get("name") or "tool"), tc.get("arguments"))
            open_calls[str(tc.get("id"))] = call_id
            result.tool_calls += 1
    failure, message = outcome(trace)
    if retried:
        failure = failure if failure.origin == taxonomy.SYSTEM else taxonomy.HARNESS_FAILED
        message = _clip(f"abandoned by a verifiers retry ({retried}); {message or 'no error recorded'}")
    rewards = {k: v for k, v in (trace.get("rewards") or {}).items()}
    scored = {k: float(v["score"]) * float(v.get("weight", 1.0)) for k, v in rewards.items() if v is not None}
    if failure.reward_valid and scored:
        traj.reward(sum(scored.values()), components=scored if len(scored) > 1 else None, verifier=SOURCE)
    elif rewards or not failure.reward_valid:
        why = message or "scoring did not run (a reward is None)"
        traj.reward(None, verifier=SOURCE, verifier_error=_clip(why, 500))
    traj.finish(failure.status, failure_origin=failure.origin, failure_label=failure.label, message=message)
    return result


def _dump(trace: Any) -> tuple[dict[str, Any], list[int]]:
    """A live `Trace` (or `WireTrace`) as the dict `record_trace` maps, and its renderer-drift nodes."""
    if isinstance(trace, Mapping):
        return dict(trace), []
    drift = [
        i
        for i, node in enumerate(trace.nodes)
        if node.sampled and node.renderer_token_ids is not None and node.renderer_token_ids != node.token_ids
    ]
    data = trace.model_dump(
        mode="python", exclude={"nodes": {"__all__": {"routed_experts", "sampling_mask"}}}
    )
    return data, drift


# -- live taps -----------------------------------------------------------------------------------
class VerifiersTap:
    """Records verifiers traces through a trajlake `Recorder`, each trace once.

    `policy_version`: the weight version the engine served (an int, or a callable read when
    each trace is recorded); None (verifiers stamps none on a trace) stores it as unknown.
    Thread-safe: rollouts may finish on several event loops.
    """

    def __init__(
        self, recorder: Recorder, *, policy_version: int | Callable[[], int | None] | None = None
    ) -> None:
        self.version = installed_version()
        self.recorder = recorder
        self.policy_version = policy_version
        self._done: set[str] = set()
        self._samples: dict[str, int] = {}
        self._lock = threading.Lock()
        self.trajectories = 0
        self.turns = 0
        self.tokens = 0
        self.warnings: list[str] = []

    def record(self, trace: Any, *, retried: str | None = None) -> bool:
        """Record one finished trace (a `Trace`, `WireTrace` or its dict); False if already recorded."""
        data, drift = _dump(trace)
        trace_id = str(data["id"])
        task = data.get("task") or {}
        key = str(task.get("key") or task.get("hash") or trace_id)
        with self._lock:
            if trace_id in self._done:
                return False
            self._done.add(trace_id)
            sample = self._samples.get(key, 0)
            self._samples[key] = sample + 1
        version = self.policy_version() if callable(self.policy_version) else self.policy_version
        rec = record_trace(self.recorder, data, policy_version=version, sample_index=sample, retried=retried,
                           renderer_drift=drift)  # fmt: skip
        with self._lock:
            self.trajectories += 1
            self.turns += rec.turns
            self.tokens += rec.tokens
            self.warnings.extend(rec.warnings)
        return True

    # in-process: Env.run_episode / Env.run_slot
    def scope(self) -> EpisodeScope:
        """Hooks for one episode (or one `run_slot`, retries included)."""
        return EpisodeScope(self)

    async def run_episode(self, env: Any, task: Any, ctx: Any) -> Any:
        """`env.run_episode(task, ctx)` with its traces recorded; returns the episode."""
        scope = self.scope()
        try:
            episode = await env.run_episode(task, ctx, on_trace=scope.on_trace, on_discard=scope.on_discard)
        except BaseException as err:
            scope.abort(err)
            raise
        scope.finish(episode)
        return episode

    async def run_slot(self, env: Any, slot: Any, ctx: Any, semaphore: Any = None) -> Any:
        """`env.run_slot(slot, ctx)` (whole-episode retries included) with its traces recorded."""
        scope = self.scope()
        try:
            episode = await env.run_slot(slot, ctx, semaphore, on_trace=scope.on_trace)
        except BaseException as err:
            scope.abort(err)
            raise
        scope.finish(episode)
        return episode

    # distributed (prime-rl): EnvClient.run(on_delta=...)
    def delta_scope(self) -> DeltaScope:
        """An `on_delta` tap for one `EnvClient.run` call."""
        return DeltaScope(self)

    async def run_client(
        self, env_client: Any, client: Any, model: str, sampling: Any, task_data: dict
    ) -> Any:
        """`env_client.run(...)` with its streamed traces recorded; returns the `WireEpisode`."""
        scope = self.delta_scope()
        try:
            episode = await env_client.run(client, model, sampling, task_data, on_delta=scope.on_delta)
        except BaseException as err:
            scope.abort(err)
            raise
        scope.finish(episode)
        return episode


class EpisodeScope:
    """`on_trace`/`on_discard` for `Env.run_episode`; `finish(episode)` ends every trace it saw."""

    def __init__(self, tap: VerifiersTap) -> None:
        self.tap = tap
        self.minted: list[Any] = []

    def on_trace(self, trace: Any) -> None:
        self.minted.append(trace)

    def on_discard(self, trace: Any) -> None:
        self.tap.record(trace, retried="per-agent retry")

    def finish(self, episode: Any) -> None:
        kept = {t.id for t in episode.traces}
        for trace in episode.traces:
            self.tap.record(trace)
        for trace in self.minted:  # earlier attempts of a whole-episode retry, or traces a failed hook left
            if trace.id not in kept:
                self.tap.record(trace, retried="episode retry or episode error")

    def abort(self, err: BaseException) -> None:
        for trace in self.minted:
            self.tap.record(trace, retried=f"the episode raised {type(err).__name__}: {err}")


class DeltaScope:
    """`on_delta` for `EnvClient.run`: assembles the streamed traces; `finish` records the episode's."""

    def __init__(self, tap: VerifiersTap) -> None:
        from verifiers.v1.serve.delta import EpisodeAssembly

        self.tap = tap
        self.assembly = EpisodeAssembly()
        self.deltas = 0

    def on_delta(self, delta: dict) -> None:
        self.deltas += 1
        trace = self.assembly.traces.get(delta["trace"])
        if delta.get("discard") and trace is not None:
            self.tap.record(_strip_pending(trace), retried="per-agent retry")
        self.assembly.apply(delta)

    def finish(self, episode: Any) -> None:
        kept = set()
        for trace in episode.traces:
            kept.add(trace.id)
            self.tap.record(trace)
        for trace_id, trace in self.assembly.traces.items():
            if trace_id not in kept:
                self.tap.record(_strip_pending(trace), retried="not in the served episode")

    def abort(self, err: BaseException) -> None:
        for trace in self.assembly.traces.values():
            self.tap.record(
                _strip_pending(trace), retried=f"the env server run raised {type(err).__name__}: {err}"
            )


def _strip_pending(trace: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in trace.items() if k != "pending"}


# -- vLLM 0.32's generate answers for verifiers 0.4.0 -------------------------------------------
class TokenFieldProxy:
    """A local HTTP proxy to vLLM that adds `token: "token_id:N"` to each logprob entry of
    `/inference/v1/generate` answers and changes nothing else.

    verifiers 0.4.0's `TrainClient` (its `renderers` 0.1.12) rejects a logprob entry without
    that field ("Engine response choice.logprobs.content[0].token must be 'token_id:N'");
    vLLM 0.32 answers `{"token_id": N, "logprob": ...}`. Point `TrainClientConfig.base_url` at
    `proxy.url`. `answers` keeps every generate answer as vLLM sent it (for checks).

        with TokenFieldProxy("http://127.0.0.1:8000") as proxy:
            client = vf.TrainClientConfig(base_url=proxy.url, ...)
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.answers: list[dict[str, Any]] = []
        self.url = ""
        self._server: Any = None

    def __enter__(self) -> TokenFieldProxy:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import httpx

        proxy = self
        http = httpx.Client(base_url=self.upstream, timeout=600)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self, method: str) -> None:
                body = (
                    self.rfile.read(int(self.headers.get("content-length") or 0))
                    if method == "POST"
                    else None
                )
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")
                }
                answer = http.request(method, self.path, content=body, headers=headers)
                data = answer.content
                if self.path.startswith("/inference/v1/generate") and answer.status_code == 200:
                    payload = answer.json()
                    proxy.answers.append(json.loads(data))
                    for choice in payload.get("choices") or []:
                        for entry in (choice.get("logprobs") or {}).get("content") or []:
                            if "token_id" in entry:
                                entry.setdefault("token", f"token_id:{entry['token_id']}")
                    data = json.dumps(payload).encode()
                self.send_response(answer.status_code)
                self.send_header("content-type", answer.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        self._http = http
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()


# -- import of a finished vf-eval run ------------------------------------------------------------
def read_traces_file(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    """(line number, trace dict) for every trace of every episode in a `traces.jsonl`."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ImportFormatError(
                    f"line {lineno}: not JSON ({err.msg}); is this a vf-eval traces.jsonl?", path=str(path)
                ) from None
            traces = row.get("traces") if isinstance(row, Mapping) else None
            if traces is None and isinstance(row, Mapping) and "nodes" in row:
                traces = [row]  # a bare trace record
            if not isinstance(traces, list):
                raise ImportFormatError(
                    f"line {lineno}: neither an episode (with `traces`) nor a trace (with `nodes`); "
                    "pass the traces.jsonl a vf-eval run wrote",
                    path=str(path),
                )
            for trace in traces:
                yield lineno, trace


def import_verifiers(
    lake: Lake,
    files: Sequence[str | Path],
    run_id: str,
    *,
    progress: Any = None,
    policy_version: int | None = None,
) -> ImportReport:
    """Import the traces of finished `vf-eval` runs (`traces.jsonl`) into `lake` under `run_id`;
    `policy_version`: the version that generated them (a trace records none), unknown when None."""
    session = ImportSession(lake, run_id, SOURCE, policy_version=policy_version)
    samples: dict[str, int] = {}
    paths = []
    for name in files:
        path = Path(name)
        if path.is_dir():
            path = path / "traces.jsonl"
        if not path.is_file():
            raise ImportFormatError(
                "no such file; pass a vf-eval run's traces.jsonl (or its directory)", path=str(name)
            )
        paths.append(path)
    for path in paths:
        for lineno, trace in read_traces_file(path):
            if not isinstance(trace, Mapping) or "id" not in trace:
                raise ImportFormatError(f"line {lineno}: a trace without an id", path=str(path))
            try:
                check_version((trace.get("verifiers") or {}).get("version"), trace.get("version"))
            except UnsupportedVerifiers as err:
                raise ImportFormatError(f"line {lineno}: {err}", path=str(path)) from None
            task = trace.get("task") or {}
            key = str(task.get("key") or task.get("hash") or trace["id"])
            sample = samples.get(key, 0)
            samples[key] = sample + 1
            trajectory_id = trajectory_id_of(run_id, str(trace["id"]))
            with session.recording():
                if session.already_imported(trajectory_id):
                    continue
                rec = record_trace(session.recorder, trace, sample_index=sample, rounded=True,
                                   policy_version=policy_version)  # fmt: skip
                session.report.turns += rec.turns
                session.report.tool_calls += rec.tool_calls
                session.report.warnings.extend(rec.warnings)
                session.done_one(trajectory_id)
            if progress is not None:
                progress.update(1)
    return session.close()
