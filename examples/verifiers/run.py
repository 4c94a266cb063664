"""verifiers 0.4 episodes against a vLLM server, recorded live into a trajlake lake.

    python examples/verifiers/run.py --lake ./trajlake-data --vllm-url http://127.0.0.1:8000

What it does, top to bottom:
1. re-runs itself in the verifiers venv (`examples/framework_venv.py`, the one way every example
   finds its venv: scripts/framework-venv.sh verifiers, Python 3.12, verifiers 0.4.0 and uv
   pinned, trajlake installed) unless verifiers and trajlake import here, and puts that venv's
   `bin` on PATH (verifiers runs its harnesses as uv scripts);
2. runs a tiny arithmetic taskset (arith_taskset.py) with verifiers' `null` chat harness in the
   subprocess runtime and a `TrainClientConfig` (token ids and logprobs from vLLM's
   `/inference/v1/generate`, served when vLLM runs with --enable-scale-out, as `trajlake vllm up`
   starts it), through trajlake's `VerifiersTap.run_episode`;
3. writes the events into the lake as they come (a sink thread: SIGINT/SIGTERM commits what it
   holds), then prints what the lake stored: each trajectory's status, reward and tokens as the
   lake counts them. It exits 1 when no rollout finished without a system failure.

vLLM 0.32's generate answers lack the logprob `token` field verifiers 0.4.0 checks, so the client
goes through the adapter's `TokenFieldProxy` (pass --no-proxy to talk to a vLLM that has it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: framework_venv
from framework_venv import enter  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lake", required=True, help="lake directory (created if missing)")
    p.add_argument("--vllm-url", required=True, help="vLLM server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model name; default: the server's first model")
    p.add_argument("--model-dir", default=None, help="tokenizer directory; default: the served model's path")
    p.add_argument("--episodes", type=int, default=3, help="tasks to run, one episode each")
    p.add_argument("--run-id", default="verifiers-example")
    p.add_argument("--no-proxy", action="store_true", help="talk to vLLM directly (no TokenFieldProxy)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    enter("verifiers", "verifiers.v1")
    from trajlake.ingest import shutdown

    return shutdown.run(lambda: run(args), "examples/verifiers")


def run(args: argparse.Namespace) -> int:
    import httpx
    import verifiers.v1 as vf

    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.recorder import Recorder
    from trajlake.ingest.sink import DeltaSink, SinkConfig, SinkThread
    from trajlake.rollout.adapters.stored import StoredTrajectories
    from trajlake.rollout.adapters.verifiers import TokenFieldProxy, VerifiersTap
    from trajlake.store.lake import Lake

    served = httpx.get(f"{args.vllm_url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]
    model, model_dir = args.model or served["id"], args.model_dir or served.get("root") or served["id"]
    sys.path.insert(0, str(HERE))  # the taskset module
    env = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset={"id": "arith_taskset", "num_tasks": args.episodes},
        agent={"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
    ))  # fmt: skip
    lake = Lake(args.lake)
    bus = InProcessBus(topic="verifiers-example")
    # offsets of a throwaway in-process topic are not kept: a later run's bus starts at 0 again
    sink = SinkThread(DeltaSink(lake, bus, SinkConfig(max_latency_s=1, exactly_once=False)))
    producer_id = f"verifiers-example-{uuid.uuid4().hex[:8]}"  # what this run stored, read back below
    tap = VerifiersTap(Recorder(bus, args.run_id, producer_id=producer_id))

    async def episodes(url: str) -> list:
        client = vf.TrainClientConfig(base_url=url, renderer_model_name=model_dir)
        ctx = vf.ModelContext(client=client, model=model, sampling=vf.SamplingConfig(max_tokens=32))
        async with env.serving():
            return [await tap.run_episode(env, task, ctx) for task in env.taskset.load()]

    start = time.monotonic()
    if args.no_proxy:
        done = asyncio.run(episodes(args.vllm_url))
    else:
        with TokenFieldProxy(args.vllm_url) as proxy:
            done = asyncio.run(episodes(proxy.url))
    seconds = time.monotonic() - start
    stats = sink.stop()
    stored = StoredTrajectories.read(lake, args.run_id, producer_id)
    print(f"ran {len(done)} verifiers episodes in {seconds:.1f} s; {stats.events} events, {stats.dead_letters} "
          f"dead letters into {args.lake}")  # fmt: skip
    print(stored.render())
    for warning in tap.warnings[:10]:
        print(f"warning: {warning}", file=sys.stderr)
    return stored.exit_code(stats.dead_letters)


if __name__ == "__main__":
    sys.exit(main())
