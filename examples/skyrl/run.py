"""SkyRL 0.4 rollouts against a vLLM server, recorded live into a trajlake lake, then served back.

    python examples/skyrl/run.py --lake ./trajlake-data --vllm-url http://127.0.0.1:8000

What it does, top to bottom:
1. re-runs itself in the SkyRL venv (`examples/framework_venv.py`, the one way every example finds
   its venv: scripts/framework-venv.sh skyrl, Python 3.12, skyrl 0.4.0 and skyrl-gym 0.4.0
   pinned, trajlake installed) unless skyrl and trajlake import here;
2. registers a two-turn arithmetic environment (arith_env.py) with skyrl-gym;
3. builds SkyRL's `SkyRLGymGenerator` through `BasePPOExp.get_generator`, overridden to wrap it in
   trajlake's `RecordingGenerator`, with SkyRL's `RemoteInferenceClient` on the vLLM server (token
   ids and logprobs from `/inference/v1/generate`, served when vLLM runs with --enable-scale-out,
   as `trajlake vllm up` starts it), and generates `--steps` batches the way the trainer does;
4. writes the events into the lake as they come (a sink thread: SIGINT/SIGTERM commits what it
   holds) and prints what the lake stored (status, reward, tokens as the lake counts them), then
   asks `LakeGenerator` for one trainer step's batch (the staleness-filtered groups from the lake,
   the other direction) and checks it with SkyRL's own `validate_generator_output`. It exits 1
   when no rollout finished without a system failure.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: framework_venv
from framework_venv import enter  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lake", required=True, help="lake directory (created if missing)")
    p.add_argument("--vllm-url", required=True, help="vLLM server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model name; default: the server's first model")
    p.add_argument("--model-dir", default=None, help="tokenizer directory; default: the served model's path")
    p.add_argument("--prompts", type=int, default=3, help="questions per batch")
    p.add_argument("--samples", type=int, default=2, help="samples per question (a GRPO group)")
    p.add_argument("--steps", type=int, default=1, help="batches to generate")
    p.add_argument("--run-id", default="skyrl-example")
    args = p.parse_args()
    enter("skyrl", "skyrl.train")
    from trajlake.ingest import shutdown

    return shutdown.run(lambda: run(args), "examples/skyrl")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # the client tells a SkyRL router each trajectory's end (/finish_session); a bare vLLM answers 404
    logging.getLogger("skyrl.backends.skyrl_train.inference_servers.remote_inference_client").setLevel(
        logging.ERROR
    )

    import httpx
    import skyrl_gym
    from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_sampling_params_for_backend
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import RemoteInferenceClient
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.entrypoints.main_base import BasePPOExp
    from skyrl.train.generators.utils import prepare_generator_input
    from skyrl.train.utils.trainer_utils import validate_generator_output
    from transformers import AutoTokenizer

    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.recorder import Recorder
    from trajlake.ingest.sink import DeltaSink, SinkConfig, SinkThread
    from trajlake.rollout.adapters.skyrl import LakeGenerator, RecordingGenerator
    from trajlake.rollout.adapters.stored import StoredTrajectories
    from trajlake.store.catalog import Catalog
    from trajlake.store.lake import Lake
    from trajlake.trainer.config import SamplerConfig
    from trajlake.trainer.sampler import Sampler

    sys.path.insert(0, str(HERE))  # the environment module
    from arith_env import QUESTIONS

    skyrl_gym.register(id="arith", entry_point="arith_env:ArithEnv")
    served = httpx.get(f"{args.vllm_url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]
    model, model_dir = args.model or served["id"], args.model_dir or served.get("root") or served["id"]
    lake = Lake(args.lake)
    bus = InProcessBus(topic="skyrl-example")
    # offsets of a throwaway in-process topic are not kept: a later run's bus starts at 0 again
    sink = SinkThread(DeltaSink(lake, bus, SinkConfig(max_latency_s=1, exactly_once=False)))
    producer_id = f"skyrl-example-{uuid.uuid4().hex[:8]}"  # what this run stored, read back below
    recorder = Recorder(bus, args.run_id, producer_id=producer_id)

    class Exp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):  # the one override
            return RecordingGenerator(
                super().get_generator(cfg, tokenizer, inference_engine_client), recorder
            )

    cfg = SkyRLTrainConfig()
    cfg.trainer.policy.model.path = model_dir
    cfg.generator.inference_engine.served_model_name = model
    cfg.generator.inference_engine.run_engines_locally = False
    cfg.generator.max_turns, cfg.generator.max_input_length = 2, 1024
    cfg.generator.sampling_params.max_generate_length = 16
    cfg.environment.skyrl_gym.max_env_workers = 0
    # BasePPOExp.__init__ loads datasets and placement groups for a full run; the generator needs neither
    exp = Exp.__new__(Exp)
    exp.cfg = cfg
    client = RemoteInferenceClient(proxy_url=args.vllm_url, server_urls=[args.vllm_url], data_parallel_size=1,
                                   model_name=model)  # fmt: skip
    generator = exp.get_generator(cfg, AutoTokenizer.from_pretrained(model_dir), client)
    rows = [(QUESTIONS * args.prompts)[i] for i in range(args.prompts)]
    prompts = [{"prompt": [{"role": "user", "content": q}], "env_class": "arith", "env_extras": {"answer": a},
                "uid": f"arith-{i}"} for i, (q, a) in enumerate(rows)]  # fmt: skip
    sampling = get_sampling_params_for_backend("vllm", cfg.generator.sampling_params)

    async def rollouts() -> None:
        for step in range(1, args.steps + 1):  # what the trainer's generation phase does each step
            batch, _ = prepare_generator_input(prompts, args.samples, sampling, "arith", "train", step)
            await generator.generate(batch, disable_tqdm=True)
        await client.aclose()

    start = time.monotonic()
    asyncio.run(rollouts())
    seconds = time.monotonic() - start
    stats = sink.stop()
    stored = StoredTrajectories.read(lake, args.run_id, producer_id)
    print(f"ran {args.steps} SkyRL generation steps in {seconds:.1f} s; {stats.events} events, "
          f"{stats.dead_letters} dead letters into {args.lake}")  # fmt: skip
    print(stored.render())

    # the other direction: one trainer step's batch from the lake (any rewards, any staleness <= 4)
    config = SamplerConfig(run_id=args.run_id, groups_per_batch=args.prompts, group_size=args.samples,
                           drop_zero_variance=False)  # fmt: skip
    lake_generator = LakeGenerator(Sampler(lake, Catalog.for_lake(args.lake), config, recorder=recorder))
    batch, _ = prepare_generator_input(prompts, args.samples, sampling, "arith", "train", args.steps + 1)
    output = asyncio.run(lake_generator.generate(batch))
    validate_generator_output(len(batch["prompts"]), output)
    lake_generator.close()
    DeltaSink(lake, bus, SinkConfig(max_latency_s=60, exactly_once=False)).run(until_idle_s=0.0)
    print(f"served {len(output['response_ids'])} trajectories from the lake to a SkyRL trainer step "
          f"(validate_generator_output passed); rewards {output['rewards']}")  # fmt: skip
    for warning in generator.warnings[:10]:
        print(f"warning: {warning}", file=sys.stderr)
    return stored.exit_code(stats.dead_letters)


if __name__ == "__main__":
    sys.exit(main())
