"""What keeping the per-token trainer values (`trainer_tokens`) costs: bytes per token and step time.

    python bench/token_values.py [--quick] [--batches N] [--repeats N] [--json PATH] [--check]

Records a loadgen run into a temporary lake, then replays its batches (`Sampler.plan`: no leases)
through the reference step (`policy_step`, TinyPolicy on CPU) twice per repetition, interleaved:
  - plain: the step as it is (`token_values_every = 0`);
  - keeping: the step keeping its token values, and `record_token_values` appending them to the
    lake's `trainer_tokens` (what `token_values_every = 1` does each step);
and reports the step-time ratio keeping / plain (median over repetitions) and the bytes per stored
token of one replay's rows: as the steps wrote them (a file per step) and compacted into one file
in each token layout (`portable`, the default, and `compact`), next to the bytes per token of the
run's `events` (every token the lake holds, stored once).
"""

from __future__ import annotations

import io
import os
import statistics
import time
from typing import Any

from harness import Bench, run


def build_lake(root: str, trajectories: int) -> str:
    """A loadgen run in a fresh lake; return its run id."""
    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.loadgen import LoadgenConfig, generate
    from trajlake.store.lake import Lake

    bus = InProcessBus()
    # short agent trajectories, as the demo's: the tiny policy is a GRU, slow on long sequences
    config = LoadgenConfig(
        run_id="bench", trajectories=trajectories, group_size=4, turns=3, prompt_tokens=48, output_tokens=24,
        env_tokens=16, vocab_size=4096, seed=7,
    )  # fmt: skip
    generate(bus, config)
    lake = Lake(root)
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    lake.close()
    return "bench"


def replay(lake: Any, batches: list[Any], vocab: int, fold: int | None, keep: bool) -> float:
    """One pass of `policy_step` over `batches` from fresh weights, keeping (and recording) or not; seconds."""
    import torch

    from trajlake.trainer.config import TrainerConfig
    from trajlake.trainer.policy import TinyPolicy
    from trajlake.trainer.step import policy_step
    from trajlake.trainer.token_values import StepInfo, record_token_values

    config = TrainerConfig(run_id="bench", seed=0, token_values_every=1 if keep else 0)
    policy = TinyPolicy(vocab, d_model=config.d_model, seed=0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    started = time.perf_counter()
    for step, batch in enumerate(batches):
        policy_step(policy, optimizer, batch, config, fold, keep_token_values=keep)
        if keep:
            record_token_values(lake, batch, StepInfo(step, step + 1, 0, config.policy_loss))
    return time.perf_counter() - started


def layout_bytes(table: Any, layout: str) -> int:
    """Bytes of `table` as one `trainer_tokens` Parquet file of the lake's writer, in token layout `layout`."""
    import pyarrow.parquet as pq

    from trajlake.store.config import LakeConfig
    from trajlake.store.files import FileWriter

    options = FileWriter(None, None, LakeConfig(token_layout=layout)).parquet_options(table.schema)  # type: ignore[arg-type]
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.tell()


def stored_bytes(lake: Any, name: str) -> int:
    """Bytes of the current data files of table `name`."""
    return int(sum(lake.file_stats(name).column("size_bytes").to_pylist()))


def measure(lake: Any, run_id: str, n_batches: int, repeats: int) -> dict[str, Any]:
    """Replay `n_batches` of the run, plain and keeping, `repeats` times interleaved; the figures."""
    from trajlake.trainer.config import SamplerConfig, TrainerConfig
    from trajlake.trainer.reference import run_policy_version, run_vocab_size
    from trajlake.trainer.sampler import Sampler

    sampler = SamplerConfig(
        run_id=run_id, max_staleness=10**6, group_wait_s=0, groups_per_batch=8, drop_zero_variance=False
    )
    batches = Sampler(lake, None, sampler).plan(run_policy_version(lake, run_id) or 0, n_batches)
    max_vocab = TrainerConfig(run_id=run_id).max_vocab_size
    vocab = run_vocab_size(lake, run_id) or max_vocab
    fold = max_vocab if vocab > max_vocab else None
    # a first keeping replay, untimed (first-use costs): the rows whose bytes are measured
    replay(lake, batches, min(vocab, max_vocab), fold, keep=True)
    result = token_bytes(lake) | {"run_id": run_id, "batches": len(batches), "repeats": repeats}
    result["trajectories"] = sum(len(b.samples) for b in batches)
    plain_s, keeping_s = [], []
    for _ in range(repeats):
        plain_s.append(replay(lake, batches, min(vocab, max_vocab), fold, keep=False))
        keeping_s.append(replay(lake, batches, min(vocab, max_vocab), fold, keep=True))
    result |= {"plain_s": statistics.median(plain_s), "keeping_s": statistics.median(keeping_s)}
    result["ratio"] = result["keeping_s"] / result["plain_s"]
    return result


def token_bytes(lake: Any) -> dict[str, Any]:
    """Bytes per token of `trainer_tokens` (as written, and as one file per layout) and of `events`."""
    import pyarrow.compute as pc

    table = lake.read("trainer_tokens")
    stored = int(pc.sum(pc.list_value_length(table.column("ratios"))).as_py())
    trained = int(pc.count(pc.list_flatten(table.column("ratios"))).as_py())
    events = lake.read("events", select="sum(n_input_tokens + n_output_tokens) as n").column("n")[0].as_py()
    figures = {
        "rows": table.num_rows,
        "tokens": stored,
        "trained_tokens": trained,
        "written_bytes": stored_bytes(lake, "trainer_tokens"),
        "portable_bytes": layout_bytes(table, "portable"),
        "compact_bytes": layout_bytes(table, "compact"),
        "events_bytes": stored_bytes(lake, "events"),
        "events_tokens": int(events),
    }
    for name in ("written", "portable", "compact"):
        figures[f"{name}_bytes_per_token"] = figures[f"{name}_bytes"] / max(stored, 1)
    figures["events_bytes_per_token"] = figures["events_bytes"] / max(figures["events_tokens"], 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    bench = Bench("token_values", __doc__, ratios={"ratio": "lower"})
    bench.parser.add_argument("--batches", type=int, default=24, help="batches of 8 groups to replay")
    bench.parser.add_argument("--repeats", type=int, default=None, help="timed repetitions (median reported)")
    args = bench.parse(argv)
    import torch

    from trajlake.store.lake import Lake

    torch.set_num_threads(1)
    repeats = args.repeats or (3 if args.quick else 7)
    with bench.scratch() as work:
        root = os.path.join(work, "lake")
        run_id = build_lake(root, 96 if args.quick else 768)
        lake = Lake(root)
        try:
            result = measure(lake, run_id, args.batches, repeats)
        finally:
            lake.close()
    result["quick"] = args.quick
    r = result
    return bench.finish(
        args,
        result,
        f"step time, keeping / plain: {r['ratio']:.3f} (median of {repeats})\n"
        f"trainer_tokens: {r['rows']:,} rows, {r['tokens']:,} output tokens ({r['trained_tokens']:,} trained); "
        f"bytes per token {r['written_bytes_per_token']:.2f} as written (a file per step), "
        f"{r['portable_bytes_per_token']:.2f} in one portable file, {r['compact_bytes_per_token']:.2f} in one compact file\n"
        f"events: {r['events_bytes_per_token']:.2f} bytes per token ({r['events_tokens']:,} tokens)\n"
        f"{r['batches']} batches, {r['trajectories']} trajectories of run {run_id}",
    )


if __name__ == "__main__":
    run(main)
