"""Scale benchmark: how the lake's costs grow as one run grows from millions of tokens to a billion.

One run is appended to in steps through the production ingest path (loadgen -> in-process bus
-> sink with its default flush rules, so commits pile up as in a live run; a new policy
version every ~2M tokens, as a trainer's versions advance). At each size it measures:
  ingest_tokens_per_s     the growth step's sink throughput (generating the events is untimed)
  catch_up_s              projections catching up on a fixed batch of 1,000 new trajectories
                          committed with projections off (what a lagging projector does); the
                          median of 5 such batches (one alone varies by a third on this box)
  point_lookup_cold_s     one trajectory with its token_ids, logprobs and loss_mask by trajectory_id
                          (`Lake.trajectory`: only the files whose Delta statistics may hold it), on
                          a fresh Lake (its Delta snapshots opened by the lookup)
  point_lookup_warm_s     the same lookup again (median of 3)
  point_lookup_sql_s      the same through the `trajectories` SQL view, warm (median of 3)
  sql_<name>_s            five aggregates users run; slowest_sql_s is the largest
  page_<name>_s           every dashboard page rendered by Streamlit's AppTest, caches cleared;
                          slowest_page_s is the largest; metrics_s is `trajlake metrics --format json`
  search_tokens_s         `trajlake search --tokens` (a two-token subsequence) over the run's output
                          tokens; search_tokens_per_s the tokens it read a second
  sampler_batch_s         a batch of 32 groups of 8 (up to 256 trajectories; staleness filter) leased in
                          a SQLite catalog, the first of a new sampler on a fresh Lake (the median of
                          3 such samplers: one alone grew 0.98-1.94x over seven runs), as a trainer
                          restarted finds the catalog: a sampler before them kept the counts of the
                          files out of reach there; sampler_empty_catalog_s is that sampler's first
                          batch, which counted them (a new catalog, at every size);
                          lease_round_trip_s releases and claims it again; sampler_next_batch_s the
                          median of the last sampler's next 3 batches (a trainer's every step after
                          its first)
  rebuild_s, compact_s    `rebuild` of every projection and `compact` (optimize, no vacuum), each
                          checked to leave the run's aggregates unchanged (so every size after the
                          first starts from a compacted lake, as a run compacted now and then)
  peak_rss_mb             the largest peak RSS of the step's phases, each run in a process of its
                          own as a deployment runs them (as a `trajlake` process, without glibc's
                          fastbins: `trajlake.cli.tune_malloc`): rss_ingest_mb (loadgen, the in-process bus
                          and the sink, then catch-up), rss_read_mb (lookups, SQL, every page,
                          metrics, the sampler), rss_rebuild_mb and rss_compact_mb
  events_commits, files, lake_bytes_per_token   Delta commits of `events`, data files of every
                          table and the live bytes of every table (data files and Delta log) per
                          token, as ingest left them
The table prints every figure at every size and its growth factor (largest size / smallest).
At the top size the long shape (~10k-token trajectories) is built and measured too.

    python bench/scale.py [--quick] [--json PATH] [--sizes 1e6,1e7,...] [--lake DIR]

Full: 1e7, 1e8, 1e9 tokens; --quick: 5e6, 5e7, 5e8 (100x too, so growth factors mean something; a
lake holds at least the five catch-up batches of 1,000 trajectories, about 5M tokens).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from trajlake.cli import tune_malloc

RUN = "bench-scale"
CHUNK_TOKENS = 2_000_000
"""Tokens per loadgen call (2,000 short or 200 long trajectories): one policy version each,
generated, then drained by the sink."""
CATCH_UP_TRAJECTORIES = 1_000
CATCH_UPS = 5
NEW_SAMPLERS = 3
BATCH_TRAJECTORIES = 256
GROUP_SIZE = 8
SHAPES: dict[str, dict[str, int]] = {
    # loadgen shapes: ~1k and ~10k tokens per trajectory (prompt + tool output + sampled)
    "short": {"turns": 4, "max_turns": 8, "prompt_tokens": 160, "output_tokens": 160, "env_tokens": 80},
    "long": {"turns": 16, "max_turns": 32, "prompt_tokens": 640, "output_tokens": 480, "env_tokens": 160},
}
FULL_SIZES = [1e7, 1e8, 1e9]
QUICK_SIZES = [5e6, 5e7, 5e8]
REPORTED = ("point_lookup_warm_s", "point_lookup_cold_s", "catch_up_s", "sampler_batch_s",
            "sampler_empty_catalog_s", "sampler_next_batch_s", "slowest_page_s", "slowest_sql_s",
            "peak_rss_mb", "lake_bytes_per_token", "search_tokens_s")  # fmt: skip

SQL = {
    "reward_by_version": "select policy_version_max as version, avg(reward) as reward, count(*) as n "
    "from trajectories where run_id = $run group by 1 order by 1",
    "failures": "select failure_origin, failure_label, count(*) as n from trajectories where run_id = $run "
    "group by all order by n desc",
    "tool_success": "select tool_name, avg(ok::int) as success, count(*) as calls from tool_calls "
    "where run_id = $run group by 1 order by 1",
    "tokens_per_turn": "select quantile_cont(n_output_tokens, [0.5, 0.9, 0.99]) as p from turns where run_id = $run",
    "staleness": "select v.latest - t.policy_version_min as staleness, count(*) as n from trajectories t, "
    "(select max(policy_version) as latest from policy_versions where run_id = $run) v "
    "where t.run_id = $run group by 1 order by 1",
}
UNCHANGED = (
    "select (select count(*) from trajectories) as trajectories, (select sum(total_tokens) from trajectories) "
    "as tokens, (select sum(reward) from trajectories) as reward, (select count(*) from turns) as turns, "
    "(select count(*) from tool_calls) as tool_calls, (select count(*) from events) as events"
)
"""Aggregates that `rebuild` and `compact` must leave as they were."""


# -- the step (a fresh process per phase) ---------------------------------------------------------
def grow(lake: Any, state: dict[str, Any], target_tokens: float, shape: str) -> tuple[int, float]:
    """Append loadgen chunks until the run holds `target_tokens`; return (tokens added, sink seconds)."""
    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.loadgen import LoadgenConfig, generate

    added, seconds = 0, 0.0
    while True:
        # stop short of the target by the catch-up batches that follow; the first chunk measures the shape
        per_trajectory = state["tokens"] / state["trajectories"] if state["trajectories"] else None
        reserved = CATCH_UPS * CATCH_UP_TRAJECTORIES
        if per_trajectory and state["tokens"] + reserved * per_trajectory >= target_tokens:
            break
        left = (target_tokens - state["tokens"]) / per_trajectory - reserved if per_trajectory else 200
        chunk = CHUNK_TOKENS / per_trajectory if per_trajectory else left
        n = max(GROUP_SIZE, GROUP_SIZE * round(min(chunk, left) / GROUP_SIZE))
        bus = InProcessBus(topic=f"{RUN}-{state['chunks']}", partitions=4)
        made = generate(bus, chunk_config(LoadgenConfig, state, n, shape))
        started = time.perf_counter()
        DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
        seconds += time.perf_counter() - started
        advance(state, made)
        added += made.tokens
    return added, seconds


def chunk_config(config_type: Any, state: dict[str, Any], trajectories: int, shape: str) -> Any:
    """The next loadgen call of the run: its groups and policy version follow the previous call's."""
    return config_type(
        trajectories=trajectories, run_id=RUN, group_size=GROUP_SIZE, policy_versions=1, seed=state["chunks"],
        first_group=state["groups"], first_version=state["chunks"], vocab_size=151_936, **SHAPES[shape],
    )  # fmt: skip


def advance(state: dict[str, Any], made: Any) -> None:
    state["chunks"] += 1
    state["groups"] += -(-made.trajectories // GROUP_SIZE)
    state["tokens"] += made.tokens
    state["trajectories"] += made.trajectories


def catch_up(lake: Any, state: dict[str, Any], shape: str) -> float:
    """Commit 1,000 new trajectories with projections off; return the seconds projections take to catch up."""
    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.loadgen import LoadgenConfig, generate
    from trajlake.store import projections

    bus = InProcessBus(topic=f"{RUN}-catch-up-{state['chunks']}", partitions=4)
    made = generate(bus, chunk_config(LoadgenConfig, state, CATCH_UP_TRAJECTORIES, shape))
    DeltaSink(lake, bus, SinkConfig(update_projections=False)).run(until_idle_s=0.0)
    advance(state, made)
    started = time.perf_counter()
    projections.catch_up(lake)
    return time.perf_counter() - started


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def point_lookups(root: Path, trajectory_id: str) -> tuple[float, float, float]:
    """`Lake.trajectory` cold (a fresh Lake) and warm, and the same lookup through the SQL view (warm)."""
    from trajlake.store.lake import Lake

    query = "select token_ids, logprobs, loss_mask from trajectories where trajectory_id = $id"
    lake = Lake(root)
    found: list[Any] = []
    cold = timed(lambda: found.append(lake.trajectory(trajectory_id)))
    if found[0].num_rows != 1:
        raise RuntimeError(f"point lookup of {trajectory_id} found {found[0].num_rows} rows")
    warm = statistics.median(timed(lambda: lake.trajectory(trajectory_id)) for _ in range(3))
    via_view = lake.sql(query, {"id": trajectory_id})
    if via_view.column("token_ids").to_pylist() != found[0].column("token_ids").to_pylist():
        raise RuntimeError(f"the SQL view and Lake.trajectory disagree on {trajectory_id}'s tokens")
    sql_warm = statistics.median(timed(lambda: lake.sql(query, {"id": trajectory_id})) for _ in range(3))
    lake.close()
    return cold, warm, sql_warm


def sampler_figures(root: Path, workdir: Path, latest_version: int) -> tuple[float, float, float, float]:
    """The first batch of a sampler on an empty catalog, a new sampler's first batch (the median
    of `NEW_SAMPLERS`, each on a fresh Lake), a lease round trip, and the last sampler's next 3
    batches (median)."""
    from trajlake.store.catalog import Catalog
    from trajlake.store.lake import Lake
    from trajlake.trainer.config import SamplerConfig
    from trajlake.trainer.sampler import Sampler

    catalog = Catalog(f"sqlite:///{workdir / f'catalog-{uuid.uuid4().hex}.db'}")  # empty at every size
    config = SamplerConfig(
        run_id=RUN, max_staleness=4, group_size=GROUP_SIZE, groups_per_batch=BATCH_TRAJECTORIES // GROUP_SIZE,
        group_wait_s=0, drop_zero_variance=False,
    )  # fmt: skip
    firsts: list[float] = []
    lakes: list[Any] = []
    for _ in range(1 + NEW_SAMPLERS):  # each leaves its batch leased: the next one gets other groups
        lakes.append(lake := Lake(root))
        sampler = Sampler(lake, catalog, config)
        started = time.perf_counter()
        batch = sampler.next_batch(trainer_version=latest_version, step=0)
        firsts.append(time.perf_counter() - started)
        if batch is None:
            raise RuntimeError("the sampler handed out no batch")

    def round_trip() -> None:
        sampler.release(batch)
        if len(catalog.claim(RUN, batch.trajectory_ids, sampler.owner)) != len(batch.trajectory_ids):
            raise RuntimeError("the released batch could not be leased again")

    lease_s = timed(round_trip)

    def next_batch(step: int) -> None:
        if sampler.next_batch(trainer_version=latest_version, step=step) is None:
            raise RuntimeError("the sampler ran out of batches")

    next_s = statistics.median(timed(lambda s=step: next_batch(s)) for step in range(1, 4))
    catalog.close()
    for lake in lakes:
        lake.close()
    return firsts[0], statistics.median(firsts[1:]), lease_s, next_s


def pages(root: Path) -> dict[str, float]:
    """AppTest render of every page of the app (run `RUN`), caches cleared before each."""
    from dashboard import time_render  # bench/dashboard.py

    from trajlake.dashboards.app import PAGES

    return {page: time_render(root, page, RUN, [RUN])[0] for page in PAGES}


def metrics_seconds(root: Path) -> float:
    from trajlake.cli import main

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            if main(["metrics", "--lake", str(root), "--run", RUN, "--format", "json"]) != 0:
                raise RuntimeError("trajlake metrics failed")

    return timed(run)


def unchanged(root: Path, before: dict[str, Any], what: str) -> None:
    from trajlake.store.lake import Lake

    lake = Lake(root)
    after = aggregates(lake)
    lake.close()
    if after != before:
        raise RuntimeError(f"{what} changed the run's aggregates: {before} -> {after}")


def aggregates(lake: Any) -> dict[str, Any]:
    """The `UNCHANGED` aggregates, as JSON gives them back to a later phase (sums as strings)."""
    return json.loads(json.dumps(lake.sql(UNCHANGED).to_pylist()[0], default=str))


def live_bytes(lake: Any, tables: tuple[str, ...]) -> int:
    """Bytes a reader of the lake sees: each table's current data files and its Delta log (files
    that an earlier step's compaction replaced, and no vacuum removed yet, are not counted)."""
    data = sum(Path(uri).stat().st_size for name in tables for uri in lake.files(name))
    logs = [Path(lake.root) / name / "_delta_log" for name in tables]
    return data + sum(f.stat().st_size for log in logs if log.exists() for f in log.iterdir() if f.is_file())


def peak_rss_mb() -> float:
    """The process's peak RSS so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def search_figures(root: Path) -> tuple[float, float]:
    """`trajlake search --tokens` over the run's output tokens (a two-token subsequence, on a fresh
    Lake): its seconds and the output tokens it read per second (what `search.SCAN_RATE` assumes)."""
    from trajlake.store.lake import Lake
    from trajlake.store.search import SearchQuery, search

    lake = Lake(root)
    try:
        result = search(lake, SearchQuery(RUN, tokens=(7, 11)))
    finally:
        lake.close()
    return result.seconds, result.tokens_read / result.seconds


PHASES = ("ingest", "read", "rebuild", "compact")
"""The step's parts, each in a process of its own, as a deployment runs them (the sink; readers:
lookups, SQL, dashboards, metrics, the sampler; `trajlake rebuild`; `trajlake compact`)."""


def step(
    root: Path, target_tokens: float, shape: str, workdir: Path, phase: str, known: dict[str, Any]
) -> dict[str, Any]:
    """One phase of a step: grow the lake at `root` to `target_tokens` and lay out what the later
    phases need (`ingest`), or measure one part at that size. Returns its figures."""
    from trajlake.store import projections
    from trajlake.store.compact import compact
    from trajlake.store.lake import TABLES, Lake

    fig: dict[str, Any] = {}
    if phase == "ingest":
        state_file = root.parent / f"{root.name}.state.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else dict.fromkeys(
            ("chunks", "groups", "tokens", "trajectories"), 0)  # fmt: skip
        lake = Lake(root)
        added, sink_s = grow(lake, state, target_tokens, shape)
        fig["ingest_tokens_per_s"] = added / sink_s if sink_s else float("nan")
        fig["catch_up_s"] = statistics.median(catch_up(lake, state, shape) for _ in range(CATCH_UPS))
        state_file.write_text(json.dumps(state))
        fig["tokens"], fig["trajectories"] = state["tokens"], state["trajectories"]
        oldest = lake.sql(
            "select trajectory_id from trajectories where run_id = $run order by started_at limit 1", {"run": RUN}
        ).column(0)[0].as_py()  # fmt: skip
        latest = lake.sql("select max(policy_version) from policy_versions").column(0)[0].as_py()
        fig["_known"] = {"oldest": oldest, "latest": latest, "before": aggregates(lake)}
        # the layout as ingest left it (rebuild and compact below rewrite it)
        fig["events_commits"] = lake.version("events") + 1
        fig["files"] = sum(len(lake.files(name)) for name in TABLES if lake.exists(name))
        fig["lake_bytes_per_token"] = live_bytes(lake, TABLES) / state["tokens"]
        lake.close()
    elif phase == "read":
        fig["point_lookup_cold_s"], fig["point_lookup_warm_s"], fig["point_lookup_sql_s"] = point_lookups(
            root, known["oldest"]
        )
        lake = Lake(root)
        lake.query_engine()
        for name, query in SQL.items():
            fig[f"sql_{name}_s"] = timed(lambda q=query: lake.sql(q, {"run": RUN}))
        lake.close()
        fig["slowest_sql_s"] = max(fig[f"sql_{n}_s"] for n in SQL)
        for page, seconds in pages(root).items():
            fig[f"page_{page}_s"] = seconds
        fig["slowest_page_s"] = max(v for k, v in fig.items() if k.startswith("page_"))
        fig["metrics_s"] = metrics_seconds(root)
        fig["search_tokens_s"], fig["search_tokens_per_s"] = search_figures(root)
        (
            fig["sampler_empty_catalog_s"], fig["sampler_batch_s"], fig["lease_round_trip_s"], fig["sampler_next_batch_s"]
        ) = sampler_figures(root, workdir, known["latest"])  # fmt: skip
    else:
        lake = Lake(root)
        fig[f"{phase}_s"] = timed(
            lambda: projections.rebuild(lake) if phase == "rebuild" else compact(lake, vacuum=False)
        )
        lake.close()
        unchanged(root, known["before"], phase)
    fig[f"rss_{phase}_mb"] = peak_rss_mb()
    return fig


# -- the driver -----------------------------------------------------------------------------------
def run_step(root: Path, target: float, shape: str, workdir: Path) -> dict[str, float]:
    """`step`'s phases, each in a fresh process: its peak RSS is the phase's own. A phase's log
    (AppTest outside a server warns on every render) is printed only when it fails."""
    figures: dict[str, Any] = {}
    known: dict[str, Any] = {}
    for phase in PHASES:
        out = (
            root.parent / f"{root.name}-{target:.0e}-{phase}.json"
        )  # next to the lake: a later step may fail
        (workdir / "known.json").write_text(json.dumps(known))
        cmd = [sys.executable, __file__, "--step", phase, "--lake", str(root), "--target", str(target),
               "--shape", shape, "--json", str(out), "--workdir", str(workdir)]  # fmt: skip
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise SystemExit(
                f"the {shape} step to {target:.0e} tokens failed in {phase}:\n{proc.stdout[-5000:]}"
            )
        figures.update(json.loads(out.read_text()))
        known = figures.pop("_known", known)
    figures["peak_rss_mb"] = max(figures[f"rss_{phase}_mb"] for phase in PHASES)
    return figures


def growth(values: list[float]) -> float | None:
    first, last = values[0], values[-1]
    return last / first if first else None


def print_table(sizes: list[float], figures: dict[str, list[float]], long: dict[str, float]) -> None:
    header = ["figure", *(f"{s:.0e} tok" for s in sizes), f"{sizes[-1]:.0e} long", "growth"]
    print(f"{header[0]:<26}" + "".join(f"{h:>13}" for h in header[1:]))
    for name, values in figures.items():
        g = growth(values)
        cells = [*values, long.get(name, float("nan"))]
        print(f"{name:<26}" + "".join(f"{v:>13.4g}" for v in cells) + (f"{g:>12.2f}x" if g else f"{'-':>13}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5e6, 5e7, 5e8 tokens instead of 1e7, 1e8, 1e9")
    parser.add_argument("--sizes", help="comma-separated sizes in tokens (e.g. 2e5,1e6), smallest first")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--lake", type=Path, help="grow the lakes under this directory (default: a temporary one)"
    )
    parser.add_argument("--step", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--target", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=SHAPES, default="short", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        known = json.loads((args.workdir / "known.json").read_text())
        args.json.write_text(
            json.dumps(step(args.lake, args.target, args.shape, args.workdir, args.step, known))
        )
        return

    sizes = (
        [float(s) for s in args.sizes.split(",")] if args.sizes else QUICK_SIZES if args.quick else FULL_SIZES
    )
    with tempfile.TemporaryDirectory(prefix="trajlake-scale-") as tmp:
        base = args.lake or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        workdir = Path(tmp)
        steps = []
        for size in sizes:
            print(f"growing the short-trajectory run to {size:.0e} tokens …", flush=True)
            steps.append(run_step(base / "short", size, "short", workdir))
        print(f"building the long-trajectory run at {sizes[-1]:.0e} tokens …", flush=True)
        long = run_step(base / "long", sizes[-1], "long", workdir)
    names = list(steps[0])
    figures = {name: [s[name] for s in steps] for name in names}
    print_table(sizes, figures, long)
    missing = [n for n in REPORTED if n not in figures]
    if missing:
        raise SystemExit(f"figures missing: {missing}")
    result = {"sizes_tokens": [s["tokens"] for s in steps], "figures": figures,
              "growth": {n: growth(v) for n, v in figures.items()}, "long": long}  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    tune_malloc()  # each phase runs as in a `trajlake` process
    main()
