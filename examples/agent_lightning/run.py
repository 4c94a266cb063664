"""Agent Lightning 1.0 rollouts against a vLLM server, recorded into a trajlake lake.

    python examples/agent_lightning/run.py --lake ./trajlake-data --vllm-url http://127.0.0.1:8000

What it does, top to bottom:
1. starts an Agent Lightning server (from its own venv: scripts/framework-venv.sh agent-lightning),
   unless --agl-server names a running one, and registers the vLLM server as its upstream;
2. runs a tiny arithmetic agent: each rollout asks one question through AGL's model proxy
   (train mode: token ids and logprobs on), scores the answer, posts the reward and marks the
   rollout succeeded, as an AGL runner does;
3. runs trajlake's poller (`trajlake import agent-lightning --server URL`, here in-process) and
   prints what it stored. Each run makes new rollouts; importing one server twice stores each once.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from trajlake.rollout.adapters.agent_lightning import import_agent_lightning
from trajlake.rollout.config import AgentLightningSettings
from trajlake.store.lake import Lake

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 3 * 3?", "9")]


@contextlib.contextmanager
def agl_server(url: str | None, model: str) -> Iterator[str]:
    """A running Agent Lightning server: `url`, or one started here whose proxy serves `model`."""
    if url:
        yield url
        return
    venv = subprocess.run([str(ROOT / "scripts" / "framework-venv.sh"), "agent-lightning"],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="agl-") as workdir:
        cmd = [f"{venv}/bin/python", "-m", "agentlightning.server", f"port={port}", "host=127.0.0.1",
               f"default_proxy.model_name={model}", f"hydra.run.dir={workdir}", "hydra.output_subdir=null"]  # fmt: skip
        log = Path(workdir) / "server.log"
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while not _healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the Agent Lightning server did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def run_rollouts(agl: httpx.Client, samples: int) -> int:
    """The agent: one proxied chat call per rollout, a reward, succeeded. Returns how many ran."""
    done = 0
    for data_id, (question, answer) in enumerate(QUESTIONS):
        for sample in range(samples):
            rid = uuid.uuid4().hex
            body = [{"input": {"data_id": f"q{data_id}", "question": question}, "rollout_id": rid,
                     "metadata": {"sample_idx_in_batch": sample}}]  # fmt: skip
            agl.post("/api/rollouts", json=body).raise_for_status()
            agl.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running", "last_attempt_id": "0"}})
            proxy = f"/proxy/rollout/{rid}/attempt/0/mode/train/openai/v1/chat/completions"
            reply = agl.post(
                proxy, json={"messages": [{"role": "user", "content": question}], "max_tokens": 16}
            )
            if reply.status_code != 200:  # the engine failed the call: the rollout failed
                agl.patch(
                    f"/api/rollouts/{rid}", json={"status": {"state": "failed", "error_message": reply.text}}
                )
                continue
            text = reply.json()["choices"][0]["message"]["content"] or ""
            reward = 1.0 if re.search(rf"\b{answer}\b", text) else 0.0
            event = {"event_type": "reward", "data": {"value": reward, "source": "agent"}}
            agl.post(f"/api/rollouts/{rid}/attempt/0/events", json=event).raise_for_status()
            agl.patch(f"/api/rollouts/{rid}", json={"status": {"state": "succeeded"}}).raise_for_status()
            done += 1
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lake", required=True, help="lake root")
    parser.add_argument("--vllm-url", required=True, help="vLLM server root (without /v1)")
    parser.add_argument("--agl-server", help="a running Agent Lightning server (default: start one)")
    parser.add_argument("--run-id", default="agl-example", help="run id of the trajectories")
    parser.add_argument("--samples", type=int, default=4, help="rollouts per question")
    args = parser.parse_args()

    model = httpx.get(f"{args.vllm_url}/v1/models", timeout=10).json()["data"][0]["id"]
    with agl_server(args.agl_server, model) as url, httpx.Client(base_url=url, timeout=120) as agl:
        # AGL's proxy sends every call to its `default_proxy.model_name`, served by the upstreams
        # registered under that name (a server you run needs default_proxy.model_name=<model>)
        agl.post("/api/models", json=[{"model": model, "endpoint": f"{args.vllm_url}/v1"}]).raise_for_status()
        started = time.monotonic()
        rollouts = run_rollouts(agl, args.samples)
        rolled = time.monotonic()
        lake = Lake(args.lake)
        report = import_agent_lightning(lake, AgentLightningSettings(server=url), args.run_id)
        imported = time.monotonic()
        tokens = lake.sql(
            "select coalesce(sum(len(input_token_ids) + len(output_token_ids)), 0) as n from events "
            "where event_type = 'turn' and run_id = $run",
            {"run": args.run_id},
        ).to_pylist()[0]["n"]
        lake.close()
    print(
        f"{rollouts} rollouts through Agent Lightning in {rolled - started:.1f} s; imported "
        f"{report.trajectories} trajectories ({report.turns} turns) in {imported - rolled:.1f} s; "
        f"run {args.run_id!r} now holds {tokens} tokens; {report.dead_letters} dead letters"
    )


if __name__ == "__main__":
    main()
