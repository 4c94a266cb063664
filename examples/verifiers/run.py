"""verifiers 0.4 episodes against a vLLM server, recorded live into a trajlake lake.

    python examples/verifiers/run.py --lake ./trajlake-data --vllm-url http://127.0.0.1:8000

What it does, top to bottom:
1. re-runs itself in the verifiers venv (scripts/framework-venv.sh verifiers: Python 3.12,
   verifiers 0.4.0 and uv pinned, trajlake installed) unless verifiers is importable here, and
   puts that venv's `bin` on PATH (verifiers runs its harnesses as uv scripts);
2. runs a tiny arithmetic taskset (arith_taskset.py) with verifiers' `null` chat harness in the
   subprocess runtime and a `TrainClientConfig` (token ids and logprobs from vLLM's
   `/inference/v1/generate`, served when vLLM runs with --enable-scale-out, as `trajlake vllm up`
   starts it), through trajlake's `VerifiersTap.run_episode`;
3. writes the events into the lake and prints what it stored.

vLLM 0.32's generate answers lack the logprob `token` field verifiers 0.4.0 checks, so the client
goes through the adapter's `TokenFieldProxy` (pass --no-proxy to talk to a vLLM that has it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def in_verifiers_venv() -> None:
    """Re-exec in the verifiers venv unless verifiers is importable here."""
    try:
        import verifiers.v1  # noqa: F401
    except ImportError:
        venv = subprocess.run([str(ROOT / "scripts" / "framework-venv.sh"), "verifiers"], check=True,
                              capture_output=True, text=True).stdout.strip().splitlines()[-1]  # fmt: skip
        os.environ["PATH"] = f"{venv}/bin{os.pathsep}{os.environ.get('PATH', '')}"
        os.execv(f"{venv}/bin/python", [f"{venv}/bin/python", __file__, *sys.argv[1:]])
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lake", required=True, help="lake directory (created if missing)")
    p.add_argument("--vllm-url", required=True, help="vLLM server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model name; default: the server's first model")
    p.add_argument("--model-dir", default=None, help="tokenizer directory; default: the served model's path")
    p.add_argument("--episodes", type=int, default=3, help="tasks to run, one episode each")
    p.add_argument("--run-id", default="verifiers-example")
    p.add_argument("--no-proxy", action="store_true", help="talk to vLLM directly (no TokenFieldProxy)")
    args = p.parse_args()
    in_verifiers_venv()

    import httpx
    import verifiers.v1 as vf

    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.recorder import Recorder
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.adapters.verifiers import TokenFieldProxy, VerifiersTap
    from trajlake.store.lake import Lake

    served = httpx.get(f"{args.vllm_url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]
    model, model_dir = args.model or served["id"], args.model_dir or served.get("root") or served["id"]
    sys.path.insert(0, str(HERE))  # the taskset module
    env = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset={"id": "arith_taskset", "num_tasks": args.episodes},
        agent={"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
    ))  # fmt: skip
    bus = InProcessBus(topic="verifiers-example")
    tap = VerifiersTap(Recorder(bus, args.run_id, producer_id="verifiers-example"))

    async def run(url: str) -> list:
        client = vf.TrainClientConfig(base_url=url, renderer_model_name=model_dir)
        ctx = vf.ModelContext(client=client, model=model, sampling=vf.SamplingConfig(max_tokens=32))
        async with env.serving():
            return [await tap.run_episode(env, task, ctx) for task in env.taskset.load()]

    start = time.monotonic()
    if args.no_proxy:
        episodes = asyncio.run(run(args.vllm_url))
    else:
        with TokenFieldProxy(args.vllm_url) as proxy:
            episodes = asyncio.run(run(proxy.url))
    seconds = time.monotonic() - start
    stats = DeltaSink(Lake(args.lake), bus, SinkConfig(max_latency_s=60, exactly_once=False)).run(
        until_idle_s=0.0
    )
    rewards = [round(t.reward, 3) for e in episodes for t in e.traces]
    print(f"recorded {tap.trajectories} trajectories, {tap.turns} turns, {tap.tokens} tokens in {seconds:.1f} s "
          f"({stats.events} events, {stats.dead_letters} dead letters) into {args.lake} run {args.run_id!r}; "
          f"rewards {rewards}")  # fmt: skip
    for warning in tap.warnings[:10]:
        print(f"warning: {warning}", file=sys.stderr)
    return 1 if stats.dead_letters else 0


if __name__ == "__main__":
    sys.exit(main())
