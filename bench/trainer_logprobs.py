"""What keeping per-token trainer logprobs would cost: step time and bytes, side by side.

    python bench/trainer_logprobs.py [--quick] [--lake DIR --run R] [--repeats N] [--json PATH]

Replays a run's batches (`Sampler.plan`: no leases, nothing recorded) through the reference
step (`policy_step`, TinyPolicy on CPU) twice per repetition, interleaved:
  - plain: the step as it is;
  - keeping: the same step, also copying each sequence's trainer logprobs at its loss-mask
    positions out of every micro-batch (what a trainer would have to publish);
and reports the step-time ratio keeping / plain (median over repetitions), how many values
that keeps and their bytes (raw float32, and as a zstd Parquet list column), next to the
rollout logprobs the lake already stores for the same trajectories (`output_logprobs`).
Without --lake it records a loadgen run into a temporary lake.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any


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


class KeepingPolicy:
    """The policy, also copying each row's trainer logprobs at its loss-mask positions out of the step."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.kept: list[Any] = []

    def logprobs_and_entropy(
        self, input_ids: Any, attention_mask: Any = None, temperature: float = 1.0, positions: Any = None
    ) -> tuple[Any, Any]:
        logprobs, entropy = self.policy.logprobs_and_entropy(
            input_ids, attention_mask, temperature, positions=positions
        )
        values, mask = logprobs.detach(), positions.bool()
        self.kept.extend(values[r][mask[r]].numpy() for r in range(values.shape[0]))
        return logprobs, entropy

    def parameters(self) -> Any:
        return self.policy.parameters()


def train_once(batches: list[Any], vocab: int, fold: int | None, keep: bool) -> tuple[float, list[Any]]:
    """One pass of `policy_step` over `batches` from fresh weights; (seconds, kept logprobs)."""
    import torch

    from trajlake.trainer.config import TrainerConfig
    from trajlake.trainer.policy import TinyPolicy
    from trajlake.trainer.step import policy_step

    config = TrainerConfig(run_id="bench", seed=0)
    policy = TinyPolicy(vocab, d_model=config.d_model, seed=0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    model: Any = KeepingPolicy(policy) if keep else policy
    started = time.perf_counter()
    for batch in batches:
        policy_step(model, optimizer, batch, config, fold)
    return time.perf_counter() - started, model.kept if keep else []


def stored_logprob_bytes(lake: Any, run_id: str, trajectory_ids: list[str]) -> int:
    """Parquet bytes of the rollout logprobs of `trajectory_ids`, written like the kept ones."""
    import pyarrow.parquet as pq

    table = lake.sql(
        "select output_logprobs from events where run_id = $run and event_type = 'turn' "
        "and list_contains($ids, trajectory_id)",
        {"run": run_id, "ids": trajectory_ids},
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.tell()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small loadgen run and 3 repetitions")
    parser.add_argument("--lake", help="replay a run of this lake instead of a loadgen run")
    parser.add_argument("--run", help="the run to replay (with --lake)")
    parser.add_argument("--batches", type=int, default=24, help="batches of 8 groups to replay")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions (median reported)")
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    args = parser.parse_args(argv)
    if bool(args.lake) != bool(args.run):
        parser.error("pass --lake and --run together (or neither, for a loadgen run)")
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from trajlake.store.lake import Lake
    from trajlake.trainer.config import SamplerConfig, TrainerConfig
    from trajlake.trainer.reference import run_policy_version, run_vocab_size
    from trajlake.trainer.sampler import Sampler

    torch.set_num_threads(1)
    repeats = args.repeats or (3 if args.quick else 7)
    work = None
    if args.lake:
        root, run_id = args.lake, args.run
    else:
        work = tempfile.mkdtemp(prefix="trajlake-bench-logprobs-")
        root = os.path.join(work, "lake")
        run_id = build_lake(root, 96 if args.quick else 768)
    lake = Lake(root)
    sampler = SamplerConfig(
        run_id=run_id, max_staleness=10**6, group_wait_s=0, groups_per_batch=8, drop_zero_variance=False
    )
    batches = Sampler(lake, None, sampler).plan(run_policy_version(lake, run_id) or 0, args.batches)
    max_vocab = TrainerConfig(run_id=run_id).max_vocab_size
    vocab = run_vocab_size(lake, run_id) or max_vocab
    fold = max_vocab if vocab > max_vocab else None
    train_once(batches[:1], min(vocab, max_vocab), fold, keep=True)  # first-use costs, untimed
    plain_s, keeping_s, kept = [], [], []
    for _ in range(repeats):
        seconds, _ = train_once(batches, min(vocab, max_vocab), fold, keep=False)
        plain_s.append(seconds)
        seconds, kept = train_once(batches, min(vocab, max_vocab), fold, keep=True)
        keeping_s.append(seconds)
    values = sum(len(k) for k in kept)
    buffer = io.BytesIO()
    column = pa.array([np.asarray(k, dtype=np.float32).tolist() for k in kept], pa.list_(pa.float32()))
    pq.write_table(pa.table({"trainer_logprobs": column}), buffer, compression="zstd")
    ids = [tid for b in batches for tid in b.trajectory_ids]
    result = {
        "quick": args.quick,
        "run_id": run_id,
        "batches": len(batches),
        "trajectories": len(ids),
        "tokens": sum(b.n_tokens for b in batches),
        "repeats": repeats,
        "plain_s": statistics.median(plain_s),
        "keeping_s": statistics.median(keeping_s),
        "values_kept": values,
        "kept_raw_bytes": 4 * values,
        "kept_parquet_bytes": buffer.tell(),
        "rollout_logprobs_parquet_bytes": stored_logprob_bytes(lake, run_id, ids),
    }
    result["ratio"] = result["keeping_s"] / result["plain_s"]
    result["ratio_best"] = min(keeping_s) / min(plain_s)
    result["kept_per_stored"] = result["kept_parquet_bytes"] / max(
        1, result["rollout_logprobs_parquet_bytes"]
    )
    print(
        f"step time, keeping / plain: {result['ratio']:.3f} (median of {repeats}; best of each {result['ratio_best']:.3f})\n"
        f"kept per replay: {values:,} logprobs, {result['kept_raw_bytes']:,} B raw, "
        f"{result['kept_parquet_bytes']:,} B as zstd Parquet = {result['kept_per_stored']:.2f} x the rollout logprobs "
        f"already stored for these trajectories ({result['rollout_logprobs_parquet_bytes']:,} B)\n"
        f"{len(batches)} batches, {len(ids)} trajectories, {result['tokens']:,} tokens of run {run_id}"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    lake.close()
    if work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
