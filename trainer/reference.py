"""The reference trainer: a readable recipe that trains the tiny policy on CPU from the lake.

    trainer = ReferenceTrainer(lake, TrainerConfig(run_id="demo", steps=20))
    trainer.setup()          # catalog, policy (resumed from the last checkpoint), optimiser, sampler
    trainer.train()          # next_batch → train_step, until `steps` or no data
    trainer.save_checkpoint()
    trainer.cleanup()

`train_step(batch)` is the unit a custom loop calls: one optimiser step on a sampled batch,
then the hand-out is committed (`batch_consumption`), the new version is checkpointed and
announced (`policy_updated`, the catalog's policy_versions; rank 0 only), and the step's
metrics (loss, entropy, grad norm, clip and masked fractions, engine logprob mismatch and
policy drift, staleness) are appended to `trainer_steps`, and every `token_values_every`-th step
its per-token values to `trainer_tokens`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trajlake.trainer.batch import Batch
from trajlake.trainer.config import TrainerConfig
from trajlake.trainer.mismatch import write_trainer_steps
from trajlake.trainer.policy import TinyPolicy
from trajlake.trainer.publish import publish_policy_updated
from trajlake.trainer.sampler import Sampler
from trajlake.trainer.step import policy_step
from trajlake.trainer.token_values import StepInfo, record_token_values, should_keep

if TYPE_CHECKING:
    from trajlake.ingest.recorder import Recorder
    from trajlake.store.catalog import Catalog
    from trajlake.store.lake import Lake

STEP_COLUMNS = (
    "loss", "entropy", "grad_norm", "clip_fraction", "masked_fraction", "mismatch", "mismatch_healthy",
    "mismatch_tokens", "drift", "drift_kl", "drift_tokens", "drift_by_staleness",
    "staleness_mean", "staleness_max", "n_trajectories", "n_tokens", "reward_mean", "duration_s",
)  # fmt: skip


def run_vocab_size(lake: Lake, run_id: str) -> int | None:
    """The vocabulary size the run's producers declared, if any."""
    table = lake.read(
        "events",
        ["vocab_size"],
        where="run_id = $run and vocab_size is not null",
        params={"run": run_id},
    )
    values = [v for v in table.column("vocab_size").to_pylist() if v]
    return max(values) if values else None


def run_policy_version(lake: Lake, run_id: str) -> int | None:
    """The highest policy version the run's events announced, if any."""
    table = lake.read("policy_versions", ["policy_version"], where="run_id = $run", params={"run": run_id})
    values = [v for v in table.column("policy_version").to_pylist() if v is not None]
    return max(values) if values else None


class ReferenceTrainer:
    """Trains `TinyPolicy` on CPU from the sampler; one class, read top to bottom."""

    def __init__(
        self,
        lake: Lake,
        config: TrainerConfig,
        *,
        catalog: Catalog | None = None,
        catalog_url: str | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.lake = lake
        self.config = config
        self.catalog = catalog
        self.catalog_url = catalog_url
        self.recorder = recorder
        self.version = 0
        self.step = 0
        self.history: list[dict[str, Any]] = []

    # -- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        """Open the catalog, build (or resume) the policy and optimiser, start the sampler."""
        from trajlake.store.catalog import Catalog

        cfg = self.config
        torch.manual_seed(cfg.seed)
        self.catalog = self.catalog or Catalog.for_lake(self.lake.root, self.catalog_url)
        self.catalog.register_run(cfg.run_id, cfg.model_dump(mode="json"))
        vocab = cfg.vocab_size or run_vocab_size(self.lake, cfg.run_id) or cfg.max_vocab_size
        self.fold_vocab = cfg.max_vocab_size if vocab > cfg.max_vocab_size else None
        self.policy = self.build_policy(min(vocab, cfg.max_vocab_size))
        self.version = self._resume()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr)
        sampler_config = cfg.sampler.model_copy(update={"run_id": cfg.run_id})
        self.sampler = Sampler(self.lake, self.catalog, sampler_config, rank=cfg.rank, recorder=self.recorder)

    def build_policy(self, vocab_size: int) -> Any:
        """The model to train: the tiny CPU policy (the Megatron adapter overrides this)."""
        return TinyPolicy(vocab_size, d_model=self.config.d_model, seed=self.config.seed)

    def _resume(self) -> int:
        """Load the run's last checkpoint if there is one; return the trainer version to start at."""
        latest = self.catalog.latest_policy_version(self.config.run_id) if self.catalog else None
        if latest and latest["checkpoint"] and os.path.exists(latest["checkpoint"]):
            payload = torch.load(latest["checkpoint"], map_location="cpu", weights_only=True)
            self.policy.load_snapshot(payload)
            self.step = int(latest["step"])
            return int(latest["version"])
        # A run recorded elsewhere (e.g. loadgen) announced its versions as events: start there,
        # so staleness is measured against the newest policy that produced data.
        return run_policy_version(self.lake, self.config.run_id) or 0

    @property
    def checkpoint_dir(self) -> Path:
        """Where this run's checkpoints go."""
        return Path(self.config.checkpoint_dir or Path(self.lake.root) / "checkpoints" / self.config.run_id)

    # -- training -------------------------------------------------------------------------
    def next_batch(self, timeout_s: float = 0.0) -> Batch | None:
        """The sampler's next batch for the current version and step (None if none is ready)."""
        return self.sampler.next_batch(self.version, self.step, timeout_s)

    def train_step(self, batch: Batch, commit: bool = True) -> dict[str, Any]:
        """One optimiser step on `batch`; commit it, publish the new version, record metrics."""
        step_index = self.step  # the step this batch was sampled for (batch_consumption's `step`)
        # the weights are version `self.version`: a batch trained on again (the overfit check) is
        # older than them from its second step on, and measures drift, not the engine mismatch
        keep = should_keep(step_index, self.config.token_values_every)
        metrics = policy_step(
            self.policy, self.optimizer, batch, self.config, self.fold_vocab,
            weights_version=self.version, keep_token_values=keep,
        )  # fmt: skip
        if commit:
            self.sampler.commit(batch)
        self.version += 1
        self.step += 1
        self.policy.version = self.version
        metrics.update(step=step_index, trainer_version=self.version, rank=self.config.rank)
        metrics["sampler"] = batch.stats.as_dict()  # what was left out: system failures, stale, ...
        if self.config.rank == 0:
            assert self.catalog is not None, "call setup() before train_step()"
            checkpoint = self.save_checkpoint()
            self.catalog.record_policy_version(self.config.run_id, self.version, self.step, checkpoint)
            summary = {k: metrics[k] for k in ("loss", "grad_norm", "mismatch", "reward_mean")}
            publish_policy_updated(
                self.lake,
                self.recorder,
                self.config.run_id,
                self.sampler.owner,
                self.version,
                self.step,
                checkpoint,
                summary,
            )
        row = {k: metrics[k] for k in STEP_COLUMNS} | {
            "run_id": self.config.run_id, "step": step_index, "trainer_version": self.version, "rank": self.config.rank,
            "batch_step": batch.step,  # the hand-out trained on: an earlier step's when a batch is trained on again
        }  # fmt: skip
        write_trainer_steps(self.lake, [row])
        if keep:
            info = StepInfo(step_index, self.version, self.config.rank, self.config.policy_loss)
            record_token_values(self.lake, batch, info)
        self.history.append(metrics)
        return metrics

    def train(self, steps: int | None = None, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Train until `steps` (default: config.steps) steps are done or no batch comes within `wait_s`."""
        target = steps if steps is not None else self.config.steps
        done: list[dict[str, Any]] = []
        while len(done) < target:
            batch = self.next_batch(timeout_s=wait_s)
            if batch is None:
                break  # no fresh data: the rollout side is behind, or the run is used up
            done.append(self.train_step(batch))
        return done

    def save_checkpoint(self) -> str:
        """Write the policy to `<checkpoint_dir>/step-<step>.pt`; return the path."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return self.policy.save(str(self.checkpoint_dir / f"step-{self.step:06d}.pt"))

    def cleanup(self) -> None:
        """Close the catalog connection (the lake belongs to the caller)."""
        if self.catalog is not None:
            self.catalog.close()


def train(lake_root: str, config: TrainerConfig, catalog_url: str | None = None, wait_s: float = 0.0) -> int:
    """Train on the lake at `lake_root` and print one JSON line of metrics per step."""
    from trajlake.store.lake import Lake

    lake = Lake(lake_root)
    trainer = ReferenceTrainer(lake, config, catalog_url=catalog_url)
    trainer.setup()
    try:
        for metrics in trainer.train(wait_s=wait_s):
            print(
                json.dumps(
                    {k: metrics[k] for k in ("step", "trainer_version", "loss", "grad_norm", "mismatch")}
                ),
                flush=True,
            )
    finally:
        trainer.cleanup()
        lake.close()
    return 0
