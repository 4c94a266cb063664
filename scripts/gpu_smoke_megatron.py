"""GPU smoke test of the Megatron-core adapter: a real GPTModel trained by the reference recipe.

Run on a machine with a CUDA GPU and the train extra installed:

    python scripts/gpu_smoke_megatron.py [--quick] [--json PATH]

It records a small synthetic run into a temporary lake (two tasks, rewarded and
unrewarded samples), trains a Megatron GPT with MegatronTrainer for a few steps on the same
batch, and checks what a user would: every loss and grad norm is finite, the rewarded
samples become more likely, and the trainer/rollout logprob mismatch of the initial
weights is reported. Exit code 0 when all checks pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile


def record_run(lake_root: str, vocab: int, length: int) -> None:
    """Synthetic rollouts: per task, samples that repeat a token are rewarded, the others not."""
    import random

    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.recorder import Recorder
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.store.lake import Lake

    rng = random.Random(0)
    bus = InProcessBus()
    recorder = Recorder(bus, "gpu-smoke", vocab_size=vocab)
    for task in range(4):
        for sample in range(4):
            rewarded = sample % 2 == 0
            out = [7 + task] * length if rewarded else [rng.randrange(vocab) for _ in range(length)]
            traj = recorder.start(task_id=f"t{task}", group_id=f"g{task}", sample_index=sample)
            traj.turn(out, [-1.0] * length, 0, input_token_ids=[1, 2 + task])
            traj.reward(1.0 if rewarded else 0.0)
            traj.finish("completed")
    lake = Lake(lake_root)
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    lake.close()


def main(argv: list[str] | None = None) -> int:
    """Run the smoke test; print a JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and shorter sequences")
    parser.add_argument("--json", metavar="PATH", help="also write the summary here")
    args = parser.parse_args(argv)

    import torch

    from trajlake.store.lake import Lake
    from trajlake.trainer.config import SamplerConfig, TrainerConfig
    from trajlake.trainer.megatron import MegatronConfig, MegatronTrainer, megatron_available

    reason = megatron_available()
    if reason:
        print(f"gpu_smoke_megatron: {reason}", file=sys.stderr)
        return 2
    steps, length, vocab = (3, 32, 128) if args.quick else (8, 128, 512)
    root = tempfile.mkdtemp(prefix="trajlake-gpu-smoke-")
    record_run(root, vocab, length)
    lake = Lake(root)
    config = TrainerConfig(
        run_id="gpu-smoke", steps=steps, lr=1e-3, policy_loss="glm5", aggregation="prompt_mean",
        max_vocab_size=vocab, sampler=SamplerConfig(groups_per_batch=4, group_wait_s=0),
    )  # fmt: skip
    trainer = MegatronTrainer(
        lake, config, MegatronConfig(num_layers=2, hidden_size=128, num_attention_heads=4)
    )
    trainer.setup()
    batch = trainer.next_batch()
    good = [i for i, s in enumerate(batch.samples) if s.reward > 0.5]

    def rewarded_logprob() -> float:
        mb = batch.tensors(good)
        with torch.no_grad():
            lps = trainer.policy.token_logprobs(mb.input_ids, mb.attention_mask)
        return float((lps * mb.loss_mask).sum() / mb.loss_mask.sum())

    before = rewarded_logprob()
    history = [trainer.train_step(batch, commit=(i == 0)) for i in range(steps)]
    after = rewarded_logprob()
    trainer.cleanup()
    lake.close()
    summary = {
        "device": torch.cuda.get_device_name(0),
        "steps": steps,
        "loss": [m["loss"] for m in history],
        "grad_norm": [m["grad_norm"] for m in history],
        "mismatch_at_start": history[0]["mismatch"],
        "rewarded_logprob_before": before,
        "rewarded_logprob_after": after,
    }
    checks = {
        "finite": all(math.isfinite(v) for v in summary["loss"] + summary["grad_norm"]),
        "learns": after > before,
    }
    summary["checks"] = checks
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
