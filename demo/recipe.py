"""`trajlake demo`: a small asynchronous agent-RL run, end to end, that visibly learns.

The recipe reads top to bottom (`run_demo`):

1. setup     — a lake, its catalog, a bus (in-process, or Kafka) and the exactly-once sink
               in a thread, so every event takes the production path into Delta tables; on the
               vLLM engine, the tiny chat model is warm-started to write tool calls (supervised,
               ~200 steps, cached next to the lake) and served;
2. overfit   — the field's first check: play candidate tasks, keep 32 with non-zero reward
               variance, train a few steps on exactly those, and show that loss and reward move;
3. run       — rollout workers (Ray, or threads) play prompt groups with the newest policy
               and record them; the trainer samples staleness-filtered groups from the lake,
               takes a step, and publishes the next version, which workers pick up mid-episode;
4. summary   — reward by policy version, pass@k, behaviour, failures, and where to look next.
"""

from __future__ import annotations

import datetime as dt
import json
import queue
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from trajlake.common.terminal import Progress
from trajlake.demo.config import RAY_MIN_CORES, DemoConfig
from trajlake.demo.envs.config import EnvConfig

if TYPE_CHECKING:
    from trajlake.ingest.bus.base import Consumer, Publisher
    from trajlake.ingest.sink import SinkThread


LAKE_LATENCY_S = 1.0
"""How often the sink commits, never sooner: each commit's projections cost the rollouts' CPU, and a
second is still fresh. Committing whenever a poll came back empty (the sink's default, for freshness)
made 1,120 events commits in 60 steps on two cores, and each step slowed from 4 s to 8 s as they grew."""
BATCH_WAIT_S = 30.0
"""How long the trainer waits for a full batch of groups with reward variance before it takes what there is."""


# -- platform pieces -----------------------------------------------------------------------------
def make_buses(config: DemoConfig) -> tuple[Publisher, Consumer]:
    """(producer bus, consumer bus): one in-process bus for both, or two Kafka clients of one topic."""
    from trajlake.ingest.bus import setup_bus

    if not config.kafka:
        bus = setup_bus("inprocess")
        return bus, bus
    from trajlake.ingest.bus.kafka import KafkaBus, create_topic
    from trajlake.ingest.config import KafkaConfig

    kafka = KafkaConfig.from_env(
        bootstrap=config.kafka, topic=config.topic or f"trajlake-demo-{config.run_id}"
    )
    create_topic(kafka)  # idempotent; the sink subscribes to it
    consumer = KafkaBus(kafka.model_copy(update={"group_id": f"trajlake-demo-sink-{config.run_id}"}))
    return KafkaBus(kafka), consumer


def wait_for_rows(
    ctx_lake: Any,
    sink: SinkThread,
    query: str,
    n: int,
    what: str,
    timeout_s: float = 120.0,
    params: dict[str, Any] | None = None,
) -> int:
    """Block until `query` (a `select count(*)`, with DuckDB `params`) returns at least `n`; return the count."""
    deadline = time.monotonic() + timeout_s
    while True:
        sink.check()
        got = int(ctx_lake.sql(query, params).column(0)[0].as_py() or 0)
        if got >= n:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {got} of {n} {what} reached the lake in {timeout_s:.0f}s; is the sink running?"
            )
        time.sleep(0.1)


def wait_for_trajectories(lake: Any, sink: SinkThread, run_id: str, n: int) -> int:
    """Block until the lake holds `n` finished trajectories of `run_id`."""
    query = "select count(*) from _t_trajectories where run_id = $run and finished"
    return wait_for_rows(lake, sink, query, n, f"trajectories of {run_id}", params={"run": run_id})


# -- trainer -------------------------------------------------------------------------------------
def make_trainer(ctx: DemoContext, run_id: str, recorder: Any, policy_loss: str, **sampling: Any) -> Any:
    """The platform's `ReferenceTrainer` for `run_id` (`HFTrainer` on the vLLM engine's model directory),
    set up on the demo's lake, catalog and bus."""
    from trajlake.trainer.config import SamplerConfig, TrainerConfig
    from trajlake.trainer.reference import ReferenceTrainer

    cfg = ctx.config
    sampler = SamplerConfig(
        run_id=run_id, max_staleness=cfg.max_staleness, group_size=cfg.samples_per_group,
        groups_per_batch=cfg.groups_per_step, drop_zero_variance=True, group_wait_s=2.0,
        poll_interval_s=0.5, lease_ttl_s=3600.0,  # each poll reads the lake: the CPU the rollouts need
    ).model_copy(update=sampling)  # fmt: skip
    config = TrainerConfig(
        run_id=run_id, steps=cfg.steps, seed=cfg.seed, vocab_size=ctx.vocab_size, lr=cfg.lr, advantage="drgrpo",
        policy_loss=policy_loss, aggregation="token_mean", sampler=sampler,
        checkpoint_dir=str(local_dir(ctx.lake) / "checkpoints" / run_id),
    )  # fmt: skip
    if ctx.vllm is not None:
        from trajlake.trainer.hf_policy import HFTrainer

        trainer = HFTrainer(
            ctx.lake, config, catalog=ctx.catalog, recorder=recorder, model_dir=ctx.vllm.model_dir
        )
    else:
        trainer = ReferenceTrainer(ctx.lake, config, catalog=ctx.catalog, recorder=recorder)
    trainer.setup()
    return trainer


def local_dir(lake: Any) -> Path:
    """Where the demo keeps its files (checkpoints, the model, vLLM's state): the lake's directory, or
    ./trajlake-data beside an object-store lake."""
    return Path(lake.root) if "://" not in str(lake.root) else Path("./trajlake-data")


# -- the recipe ------------------------------------------------------------------------------------
@dataclass
class DemoContext:
    """Everything the phases share."""

    config: DemoConfig
    out: TextIO
    lake: Any
    catalog: Any
    producer: Publisher
    consumer: Consumer
    sink: SinkThread
    vllm: Any = None  # the VllmEngine, on the vllm engine
    server: dict[str, Any] | None = None  # the vLLM server this demo started (stopped at the end)
    warm_start: dict[str, Any] | None = None  # what the warm start did, on the vllm engine
    started: float = field(default_factory=time.monotonic)

    @property
    def vocab_size(self) -> int:
        """The vocabulary the policy reads and writes."""
        from trajlake.demo.envs.vocab import VOCAB_SIZE

        return self.vllm.vocab_size if self.vllm is not None else VOCAB_SIZE

    @property
    def model(self) -> str:
        """What trajectories name as their model."""
        from trajlake.demo.envs.engines import TinyEngine

        return self.vllm.model if self.vllm is not None else TinyEngine.model

    def engine(self, trainer: Any) -> Any:
        """The engine that serves `trainer`'s policy to the rollouts, starting from its current weights."""
        from trajlake.demo.envs.engines import TinyEngine

        if self.vllm is None:
            return TinyEngine(trainer)
        self.vllm.reset()  # a fresh trainer: the server serves the model directory's weights again
        return self.vllm

    @property
    def run_id(self) -> str:
        """The main run's id (resolved by `setup`)."""
        assert self.config.run_id is not None, "setup() resolves the run id"
        return self.config.run_id

    def say(self, text: str = "") -> None:
        """Print one line of the demo's story."""
        print(text, file=self.out, flush=True)


def setup(config: DemoConfig, out: TextIO) -> DemoContext:
    """Open the lake and catalog, connect the bus, start the sink."""
    import torch

    from trajlake.ingest.sink import DeltaSink, SinkConfig, SinkThread
    from trajlake.store.catalog import Catalog
    from trajlake.store.config import CatalogSettings
    from trajlake.store.lake import Lake

    torch.set_num_threads(1)  # many small models in a few threads: one thread each beats contention
    lake = Lake(config.lake)
    catalog = Catalog.for_lake(lake.root, CatalogSettings.from_env().catalog_url)  # a stack's PostgreSQL
    if config.run_id is None:
        config = config.model_copy(update={"run_id": free_run_id(lake, catalog)})
    producer, consumer = make_buses(config)
    # on a stack its projector follows `events`: a second one here would take the projections over
    # and the stack's would stand down, leaving them to a demo that stops
    sink_config = SinkConfig(max_latency_s=LAKE_LATENCY_S, poll_timeout_s=0.05, flush_when_idle=False,
                             update_projections=config.stack is None)  # fmt: skip
    sink = SinkThread(DeltaSink(lake, consumer, sink_config))
    ctx = DemoContext(config, out, lake, catalog, producer, consumer, sink)
    if config.engine == "vllm":
        try:
            start_vllm(ctx)
        except BaseException:
            cleanup(ctx)
            raise
    return ctx


def start_vllm(ctx: DemoContext) -> None:
    """Build the model directory if missing, warm-start it, start (or reach) the vLLM server serving the
    warm-started weights as version 0."""
    from trajlake.demo.envs.engines import VllmEngine
    from trajlake.demo.model import init_model
    from trajlake.ingest.broker import free_port
    from trajlake.rollout.engine.server import VllmServerConfig, start_server

    cfg = ctx.config
    local = local_dir(ctx.lake)
    model_dir = Path(cfg.model_dir) if cfg.model_dir else local / "model"
    if not (model_dir / "config.json").exists():
        ctx.say(f"building a tiny Qwen2 chat model in {model_dir} (trajlake model init)")
        init_model(model_dir)
    if cfg.warm_start.steps:
        model_dir = warm_start_model(ctx, model_dir, local / "model-warm")
    if cfg.vllm_url:
        base_url, name = cfg.vllm_url, served_name(cfg.vllm_url)
    else:
        ctx.say("starting vLLM (trajlake vllm up; the first run installs it into a cached venv)")
        server = VllmServerConfig(model=model_dir, port=free_port(), state_dir=local / "vllm", seed=cfg.seed)
        ctx.server = start_server(server, log=ctx.out, die_with_parent=True)
        base_url, name = ctx.server["base_url"], ctx.server["model"]
    ctx.vllm = VllmEngine(model_dir, base_url, name, cfg.env.temperature)


def warm_start_model(ctx: DemoContext, model_dir: Path, out_dir: Path) -> Path:
    """The warm-started copy of `model_dir` (trained now, or the one a run before left in `out_dir`)."""
    from trajlake.demo.warm_start import warm_start

    cfg = ctx.config
    ws = cfg.warm_start
    ctx.say(
        f"warm start: {ws.steps} supervised steps on {ws.transcripts} synthetic transcripts "
        f"({ws.wrong_tool_share:.0%} call the wrong tool first, {ws.wrong_tool_share * ws.recover_share:.0%} then the "
        f"right one; {ws.retry_share:.0%} retry a malformed call)"
    )
    done = warm_start(model_dir, out_dir, ws, cfg.env, seed=cfg.seed + 20_000)  # tasks apart from the RL's
    how = "reused from an earlier run" if done["cached"] else "trained"
    ctx.say(
        f"  {how} in {done['seconds']:.0f}s: loss {done['loss_first']:.2f} -> {done['loss_last']:.2f}, "
        f"model {out_dir}"
    )
    ctx.warm_start = done
    return out_dir


def served_name(base_url: str) -> str:
    """The model a running server serves (its first entry of /v1/models)."""
    import httpx

    return str(httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]["id"])


def free_run_id(lake: Any, catalog: Any) -> str:
    """`demo` on a fresh lake (the README's examples use it), else demo-<UTC time>."""
    taken = catalog.get_run("demo") is not None or catalog.get_run("demo-overfit") is not None
    if not taken and lake.exists("trajectories"):
        taken = lake.read("trajectories", ["run_id"], where="run_id in ('demo', 'demo-overfit')").num_rows > 0
    return "demo-" + dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S") if taken else "demo"


def cleanup(ctx: DemoContext) -> None:
    """Stop the sink (after a final flush) and close connections."""
    ctx.producer.flush()
    ctx.sink.stop(timeout_s=60)
    for bus in {id(ctx.producer): ctx.producer, id(ctx.consumer): ctx.consumer}.values():
        bus.close()
    ctx.catalog.close()
    if ctx.vllm is not None:
        ctx.vllm.close()
    if ctx.server is not None:
        from trajlake.rollout.engine.server import stop_server

        stop_server(Path(ctx.server["log"]).parent, ctx.server["port"])


# -- phases ----------------------------------------------------------------------------------------
def play_candidates(
    ctx: DemoContext, recorder: Any, engine: Any, tasks: list[Any], samples: int, env: EnvConfig, seed: int
) -> list[Any]:
    """Play `samples` episodes of each task on `workers` threads (the overfit check's small batches).

    Each task's episodes draw from their own seeded rng, so the results do not depend on scheduling.
    """
    from concurrent.futures import ThreadPoolExecutor

    from trajlake.demo.envs.loop import play_group

    idle = queue.SimpleQueue()
    for i in range(ctx.config.workers):
        idle.put(engine.policy(seed + i, env))

    def play(index: int, task: Any) -> list[Any]:
        client = idle.get()
        try:
            rng = random.Random(seed * 7919 + index)
            return play_group(recorder, task, task.task_id, samples, client, env, rng, ctx.model)
        finally:
            idle.put(client)

    with ThreadPoolExecutor(ctx.config.workers, thread_name_prefix="overfit") as pool:
        return [r for group in pool.map(play, range(len(tasks)), tasks) for r in group]


def overfit_check(ctx: DemoContext) -> dict[str, Any]:
    """Find tasks with reward variance, train a few steps on exactly them, and measure the change."""
    from trajlake.demo.envs.config import FaultConfig
    from trajlake.demo.envs.tasks import make_task
    from trajlake.ingest.recorder import Recorder
    from trajlake.trainer.overfit import select_overfit

    cfg = ctx.config
    run_id = f"{cfg.run_id}-overfit"
    n_wanted, samples = cfg.overfit_tasks, cfg.overfit_samples
    ctx.say(
        f"[1/2] overfit check: {n_wanted} tasks with non-zero reward variance, {samples} samples each (run {run_id})"
    )
    recorder = Recorder(
        ctx.producer, run_id, vocab_size=ctx.vocab_size, producer_id="demo-overfit", flush_each_turn=False
    )
    # the same batch, trained on again and again: the loss decides whether that overfits or breaks the model.
    # On the tiny GRU (lr 1e-2) 8 steps of glm5 took the batch's tasks 0.04 -> 0.34-0.58, ppo -> 0.08-0.13
    # (3 seeds each). On the warm-started chat model (lr 1e-4) glm5, which pushes the wrong samples' tokens
    # down without bound, their tool-call format as well, lowered the reward in 3 of 4 checks (0.48 -> 0.44);
    # at 3e-4 every call written after was malformed (0.00). ppo's clip rose in 4 of 4 (0.43 -> 0.50 to 0.62).
    trainer = make_trainer(
        ctx,
        run_id,
        recorder,
        cfg.overfit_loss,
        max_staleness=10**6,
        group_size=samples,
        groups_per_batch=n_wanted,
        group_wait_s=0.0,
    )
    engine = ctx.engine(trainer)
    # learnability is under test here, not the harness: no injected faults
    clean = cfg.env.model_copy(update={"faults": FaultConfig.none()})
    rng = random.Random(cfg.seed + 2)
    played, index, selected = 0, 0, []
    candidates: dict[str, Any] = {}
    for round_ in range(12):  # a random policy passes rarely: keep drawing candidates until 32 vary
        tasks = [make_task(index + i, rng, clean) for i in range(2 * n_wanted)]
        index += len(tasks)
        candidates.update((t.task_id, t) for t in tasks)
        results = play_candidates(ctx, recorder, engine, tasks, samples, clean, cfg.seed + 100 + round_)
        played += len(results)
        ctx.producer.flush()
        wait_for_trajectories(ctx.lake, ctx.sink, run_id, played)
        selected = select_overfit(ctx.lake, run_id, n_wanted, min_samples=samples)
        ctx.say(f"  candidates: {played // samples} tasks played, {len(selected)} with reward variance")
        if len(selected) >= n_wanted:
            break
    batch = trainer.next_batch(timeout_s=5.0)
    if batch is None:
        raise RuntimeError(f"the sampler handed out no group of {run_id}; are the trajectories in the lake?")
    chosen = sorted({s.task_id for s in batch.samples})
    before = [s.reward for s in batch.samples]
    losses = []
    for step in range(cfg.overfit_steps):
        # the same batch every step (that is the overfitting); its hand-out is committed once
        metrics = trainer.train_step(batch, commit=step == 0)
        losses.append(metrics["loss"])
    engine.publish(trainer)
    replay = [candidates[task_id] for task_id in chosen]
    after_results = play_candidates(ctx, recorder, engine, replay, samples, clean, cfg.seed + 999)
    after = [r.reward for r in after_results if r.reward is not None and not r.is_system_failure]
    report = {
        "run_id": run_id,
        "tasks": len(chosen),
        "candidates": played // samples,
        "steps": cfg.overfit_steps,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "reward_before": sum(before) / len(before),
        "reward_after": sum(after) / max(1, len(after)),
    }
    ctx.say(
        f"  trained {cfg.overfit_steps} steps on them: loss {report['loss_first']:+.3f} -> {report['loss_last']:+.3f}, "
        f"reward on these tasks {report['reward_before']:.2f} -> {report['reward_after']:.2f}"
    )
    return report


def task_stream(seed: int, env: EnvConfig) -> Any:
    """An endless stream of fresh (task, group id) pairs: every prompt group is a new task."""
    from trajlake.demo.envs.tasks import make_task

    rng = random.Random(seed)
    index = 0
    while True:
        task = make_task(index, rng, env)
        index += 1
        yield task, task.task_id


def start_workers(ctx: DemoContext, feed: Any, engine: Any) -> Any:
    """Rollout workers on a local Ray runtime, or threads with `--no-ray`; already started."""
    from trajlake.demo.envs.loop import RolloutThreads
    from trajlake.ingest.recorder import Recorder

    cfg = ctx.config

    def make_recorder(i: int) -> Recorder:
        return Recorder(
            ctx.producer,
            cfg.run_id,
            vocab_size=ctx.vocab_size,
            producer_id=f"demo-rollout-{i}",
            flush_each_turn=False,
        )

    if cfg.ray:
        from trajlake.demo.envs.ray_workers import RolloutActors

        workers: Any = RolloutActors(
            cfg.workers, feed, make_recorder(0), engine, cfg.env, cfg.samples_per_group, cfg.seed
        )
    else:
        workers = RolloutThreads(
            cfg.workers,
            feed,
            make_recorder,
            lambda seed: engine.policy(seed, cfg.env),
            cfg.env,
            cfg.samples_per_group,
            cfg.seed,
            model=ctx.model,
        )
    workers.start()
    return workers


def train_run(ctx: DemoContext) -> dict[str, Any]:
    """The async run: workers play with the newest weights while the trainer samples from the lake."""
    from trajlake.demo.envs.loop import TaskFeed
    from trajlake.ingest.recorder import Recorder
    from trajlake.trainer.sampler import Sampler

    cfg = ctx.config
    run_id = ctx.run_id
    ctx.say(
        f"[2/2] async RL run: {cfg.steps} steps x {cfg.groups_per_step} groups x {cfg.samples_per_group} samples, "
        f"max_staleness {cfg.max_staleness}, fresh weights"
    )
    recorder = Recorder(ctx.producer, run_id, vocab_size=ctx.vocab_size, producer_id="demo-trainer")
    trainer = make_trainer(ctx, run_id, recorder, "ppo")
    # the trainer's settings (what `trajlake ablate` replays the run with), and the demo's
    ctx.catalog.register_run(
        run_id, trainer.config.model_dump(mode="json") | {"demo": cfg.model_dump(mode="json")}
    )
    engine = ctx.engine(trainer)
    feed = TaskFeed(task_stream(cfg.seed + 10_000, cfg.env), max_ahead=2 * cfg.groups_per_step)
    # groups whose samples all scored the same carry no GRPO signal: the trainer's sampler leaves
    # them out, but the demo falls back to them rather than stall once the policy solves (or
    # fails) everything alike
    with_signal = trainer.sampler
    any_group = Sampler(
        ctx.lake,
        ctx.catalog,
        with_signal.config.model_copy(update={"drop_zero_variance": False}),
        owner=with_signal.owner,
        recorder=recorder,
    )
    workers = start_workers(ctx, feed, engine)
    progress = Progress(cfg.steps, "train", "steps", stream=ctx.out, every=5)
    step = 0
    try:
        while step < cfg.steps:
            ctx.sink.check()
            workers.check()
            sampler = with_signal
            # a full batch (groups_per_step groups) unless the rollouts cannot fill one in time: the
            # workers keep playing meanwhile, and a step on one or two groups learns little
            batch = with_signal.next_batch(trainer.version, trainer.step, timeout_s=BATCH_WAIT_S)
            if batch is None:
                sampler, batch = any_group, any_group.next_batch(trainer.version, trainer.step, timeout_s=0.0)
            if batch is None:
                feed.release(cfg.groups_per_step)  # nothing ready: let the workers run further ahead
                continue
            # free the buffer before training, so rollouts go on with the current weights while the
            # step runs and switch to the new version mid-episode when it is published
            feed.release(len({s.group_id for s in batch.samples}))
            metrics = trainer.train_step(batch, commit=False)
            engine.publish(trainer)  # workers sample with it from their next turn on
            sampler.commit(batch)
            step += 1
            progress.update(
                reward=metrics["reward_mean"], loss=metrics["loss"], stale=metrics["staleness_max"]
            )
    finally:
        progress.close()
        feed.stop()
        workers.join()
    ctx.producer.flush()
    return {"run_id": run_id, "steps": step, "trajectories": feed.finished, "final_version": trainer.version}


def send_bad_messages(ctx: DemoContext) -> int:
    """A simulated legacy producer sends malformed events; the sink files them as dead letters."""
    from trajlake.ingest import codec
    from trajlake.ingest.bus.base import Message

    cfg = ctx.config
    problems: list[dict[str, Any]] = [
        {"schema_version": 99},  # a schema version the platform does not know
        {"output_token_ids": [3, 10**6], "output_logprobs": [-0.1, -0.2]},  # a token id beyond the vocabulary
        {"output_token_ids": [3, 4], "output_logprobs": [-0.1, 0.5]},  # a positive logprob
    ]
    for i in range(cfg.bad_messages):
        event: dict[str, Any] = {
            "event_id": f"legacy-{cfg.run_id}-{i}", "event_type": "turn", "schema_version": 1, "run_id": cfg.run_id,
            "trajectory_id": f"legacy-{cfg.run_id}-{i}", "seq": 1, "turn_index": 0, "policy_version": 0,
            "vocab_size": 64, "event_time": dt.datetime.now(dt.UTC).isoformat(), "producer_id": "legacy-harness",
            "output_token_ids": [3], "output_logprobs": [-0.1],
        }  # fmt: skip
        event.update(problems[i % len(problems)])
        body = json.dumps(event).encode()
        ctx.producer.send(
            Message(
                key=event["trajectory_id"],
                value=body,
                headers={codec.CONTENT_TYPE_HEADER: codec.JSON_CONTENT_TYPE},
            )
        )
    return cfg.bad_messages


def drain(ctx: DemoContext, run: dict[str, Any], n_bad: int) -> None:
    """Wait until everything the run published is in the lake: trajectories, versions, dead letters."""
    run_id = ctx.run_id
    wait_for_trajectories(ctx.lake, ctx.sink, run_id, run["trajectories"])
    of_run = {"run": run_id}
    versions = "select count(*) from policy_versions where run_id = $run"
    wait_for_rows(ctx.lake, ctx.sink, versions, run["steps"], "policy versions", params=of_run)
    consumed = "select count(distinct step) from batch_consumption where run_id = $run"
    wait_for_rows(ctx.lake, ctx.sink, consumed, run["steps"], "consumed batches", params=of_run)
    dead = "select count(*) from dead_letters where run_id = $run"
    wait_for_rows(ctx.lake, ctx.sink, dead, n_bad, "dead letters", params=of_run)


def run_demo(config: DemoConfig, out: TextIO | None = None) -> dict[str, Any]:
    """Run the whole demo; return the summary (also printed to `out`)."""
    from trajlake.demo import report as demo_report

    out = out or sys.stdout
    ctx = setup(config, out)
    config = ctx.config  # with its run id resolved
    try:
        ctx.say(
            f"trajlake demo · run {config.run_id} · lake {ctx.lake.root} · "
            f"bus {'kafka ' + config.kafka if config.kafka else 'in-process'} · "
            f"workers {config.workers} {'ray' if config.ray else 'threads'}"
            + ("" if config.ray else f" (Ray by default from {RAY_MIN_CORES} cores; --ray)")
        )
        overfit = overfit_check(ctx) if config.overfit_tasks else None
        run = train_run(ctx)
        n_bad = send_bad_messages(ctx)
        ctx.producer.flush()
        drain(ctx, run, n_bad)
    finally:
        cleanup(ctx)
    summary = demo_report.summarize(ctx.lake, config, overfit, run, time.monotonic() - ctx.started)
    demo_report.print_summary(summary, out)
    return summary


def summary_json(summary: dict[str, Any]) -> str:
    """The summary as JSON text."""
    return json.dumps(summary, indent=2, default=str)
