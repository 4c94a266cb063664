"""A Harbor 0.25 job (terminus-2 against a vLLM server) recorded live into a trajlake lake.

    python examples/harbor/run.py --lake ./trajlake-data --vllm-url http://127.0.0.1:8000

What it does, top to bottom:
1. re-runs itself in the Harbor venv (`examples/framework_venv.py`, the one way every example
   finds its venv: scripts/framework-venv.sh harbor, Python 3.12, harbor 0.25.0 pinned, trajlake
   installed) unless harbor and trajlake import here;
2. writes a tiny task (tiny_task.py) and runs a Harbor `Job` with the `terminus-2` agent on
   `hosted_vllm/<served model>` with `collect_rollout_details`, in trajlake's host environment
   (`EnvironmentConfig.import_path`: commands run as host subprocesses in a scratch dir, so no
   Docker is needed; terminus-2 needs `tmux` on PATH);
3. records each trial as it ends through `HarborHook.attach(job)` (`job.on_trial_ended`),
   writes the events into the lake as they come (a sink thread: SIGINT/SIGTERM commits what it
   holds) and prints what the lake stored (status, reward, tokens as the lake counts them).

A tiny model rarely answers in terminus-2's JSON format: expect a trial that failed as the
model's (a failure label, its turns' token ids), not a solved task. The example exits 1 when no
trial finished without a system failure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
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
    p.add_argument("--max-turns", type=int, default=2, help="terminus-2's turn limit")
    p.add_argument("--trials", type=int, default=1, help="attempts of the task (Harbor's n_attempts)")
    p.add_argument("--run-id", default="harbor-example")
    args = p.parse_args()
    enter("harbor", "harbor")
    # LiteLLM reads its model cost map from GitHub unless told to use its packaged copy
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HOSTED_VLLM_API_KEY", "none")  # the local vLLM takes no key
    from trajlake.ingest import shutdown

    return shutdown.run(lambda: run(args), "examples/harbor")


def run(args: argparse.Namespace) -> int:
    import httpx
    from harbor.job import Job
    from harbor.models.job.config import JobConfig, TaskConfig
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig

    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.recorder import Recorder
    from trajlake.ingest.sink import DeltaSink, SinkConfig, SinkThread
    from trajlake.rollout.adapters.harbor import HOST_ENVIRONMENT, HarborHook
    from trajlake.rollout.adapters.stored import StoredTrajectories
    from trajlake.store.lake import Lake

    sys.path.insert(0, str(HERE))
    from tiny_task import make_task

    url = args.vllm_url.rstrip("/")
    served = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    model = args.model or served["id"]
    agent = AgentConfig(name="terminus-2", model_name=f"hosted_vllm/{model}", kwargs={
        "api_base": f"{url}/v1", "collect_rollout_details": True, "max_turns": args.max_turns,
        "record_terminal_session": False, "enable_summarize": False, "temperature": 1.0,
        "model_info": {"max_input_tokens": served.get("max_model_len") or 4096, "max_output_tokens": 1024,
                       "input_cost_per_token": 0.0, "output_cost_per_token": 0.0},
    })  # fmt: skip
    lake = Lake(args.lake)
    bus = InProcessBus(topic="harbor-example")
    # offsets of a throwaway in-process topic are not kept: a later run's bus starts at 0 again
    sink = SinkThread(DeltaSink(lake, bus, SinkConfig(max_latency_s=1, exactly_once=False)))
    producer_id = f"harbor-example-{uuid.uuid4().hex[:8]}"  # what this run stored, read back below
    hook = HarborHook(Recorder(bus, args.run_id, producer_id=producer_id))

    with tempfile.TemporaryDirectory(prefix="harbor-example-") as scratch:
        config = JobConfig(job_name="example", jobs_dir=Path(scratch) / "jobs", quiet=True, n_attempts=args.trials,
                           skip_credential_checks=True, environment=EnvironmentConfig(import_path=HOST_ENVIRONMENT),
                           agents=[agent], tasks=[TaskConfig(path=make_task(Path(scratch)))])  # fmt: skip

        async def run() -> None:
            job = await Job.create(config)
            hook.attach(job)
            await job.run()

        start = time.monotonic()
        asyncio.run(run())
        seconds = time.monotonic() - start
    stats = sink.stop()
    stored = StoredTrajectories.read(lake, args.run_id, producer_id)
    print(f"ran {args.trials} Harbor trials in {seconds:.1f} s; {stats.events} events, {stats.dead_letters} "
          f"dead letters into {args.lake}")  # fmt: skip
    print(stored.render())
    for warning in hook.warnings[:10]:
        print(f"warning: {warning}", file=sys.stderr)
    return stored.exit_code(stats.dead_letters)


if __name__ == "__main__":
    sys.exit(main())
