"""A Harbor 0.25 job (terminus-2 against a vLLM server) recorded live into a trajlake lake.

    python examples/harbor/run.py --lake ./trajlake-data --vllm-url http://127.0.0.1:8000

What it does, top to bottom:
1. re-runs itself in the Harbor venv (scripts/framework-venv.sh harbor: Python 3.12, harbor
   0.25.0 pinned, trajlake installed) unless harbor is importable here;
2. writes a tiny task (tiny_task.py) and runs a Harbor `Job` with the `terminus-2` agent on
   `hosted_vllm/<served model>` with `collect_rollout_details`, in trajlake's host environment
   (`EnvironmentConfig.import_path`: commands run as host subprocesses in a scratch dir, so no
   Docker is needed; terminus-2 needs `tmux` on PATH);
3. records each trial as it ends through `HarborHook.attach(job)` (`job.on_trial_ended`),
   writes the events into the lake and prints what it stored.

A tiny model rarely answers in terminus-2's JSON format: expect a failed trial with a failure
label (and its turns' token ids), not a solved task.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def in_harbor_venv() -> None:
    """Re-exec in the Harbor venv unless harbor is importable here."""
    try:
        import harbor  # noqa: F401
    except ImportError:
        venv = subprocess.run([str(ROOT / "scripts" / "framework-venv.sh"), "harbor"], check=True,
                              capture_output=True, text=True).stdout.strip().splitlines()[-1]  # fmt: skip
        os.execv(f"{venv}/bin/python", [f"{venv}/bin/python", __file__, *sys.argv[1:]])
    # LiteLLM reads its model cost map from GitHub unless told to use its packaged copy
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("HOSTED_VLLM_API_KEY", "none")  # the local vLLM takes no key


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lake", required=True, help="lake directory (created if missing)")
    p.add_argument("--vllm-url", required=True, help="vLLM server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model name; default: the server's first model")
    p.add_argument("--max-turns", type=int, default=2, help="terminus-2's turn limit")
    p.add_argument("--trials", type=int, default=1, help="attempts of the task (Harbor's n_attempts)")
    p.add_argument("--run-id", default="harbor-example")
    args = p.parse_args()
    in_harbor_venv()

    import httpx
    from harbor.job import Job
    from harbor.models.job.config import JobConfig, TaskConfig
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig

    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.recorder import Recorder
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.adapters.harbor import HOST_ENVIRONMENT, HarborHook
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
    bus = InProcessBus(topic="harbor-example")
    hook = HarborHook(Recorder(bus, args.run_id, producer_id="harbor-example"))

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
    stats = DeltaSink(Lake(args.lake), bus, SinkConfig(max_latency_s=60, exactly_once=False)).run(
        until_idle_s=0.0
    )
    print(f"recorded {hook.trajectories} trajectories, {hook.turns} turns, {hook.tokens} tokens in {seconds:.1f} s "
          f"({stats.events} events, {stats.dead_letters} dead letters) into {args.lake} run {args.run_id!r}")  # fmt: skip
    for warning in hook.warnings[:10]:
        print(f"warning: {warning}", file=sys.stderr)
    return 1 if stats.dead_letters else 0


if __name__ == "__main__":
    sys.exit(main())
